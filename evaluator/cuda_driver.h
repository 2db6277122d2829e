// The CUDA driver, loaded at run time (dlopen("libcuda.so.1") + cuGetProcAddress)
// so that binaries start on machines without a GPU. One process-wide table,
// loaded once; thread-safe after Get() returns. Plus RAII owners for the driver
// objects we create.
#pragma once

#include <cuda.h>

#include <string>
#include <utility>

#include "common/status.h"

namespace ks {

struct CudaDriver {
#define KS_CU_FN(name) decltype(&::name) name = nullptr;
#include "evaluator/cuda_driver_fns.inc"
#undef KS_CU_FN

  // Loads libcuda and cuInit(0). FailedPrecondition "no NVIDIA driver" / "no GPU".
  static StatusOr<const CudaDriver*> Get();

  // "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (out of memory)", or Ok.
  Status Check(CUresult r, const char* what) const;
  std::string ErrorName(CUresult r) const;
};

// Is there a usable GPU? Never fails; for tests that skip and for arch detection.
bool GpuAvailable(std::string* why = nullptr);

// Device memory free now on GPU `device_ordinal` (cuMemGetInfo in its primary
// context): what a new evaluator may still allocate.
StatusOr<uint64_t> FreeDeviceMemory(int device_ordinal);
// "sm_90" for device 0, when a GPU is present.
StatusOr<std::string> DetectArch();

// Device memory owned by a context-bound allocation. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static StatusOr<DeviceBuffer> Alloc(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, 0)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  CUdeviceptr get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

// Device memory of another process, mapped in the current context from its
// CUDA IPC handle (64 raw bytes of a CUipcMemHandle); unmapped on destruction.
// Move-only.
class IpcMapping {
 public:
  IpcMapping() = default;
  static StatusOr<IpcMapping> Open(const std::string& handle);
  ~IpcMapping();
  IpcMapping(IpcMapping&& o) noexcept : ptr_(std::exchange(o.ptr_, 0)) {}
  IpcMapping& operator=(IpcMapping&& o) noexcept;
  IpcMapping(const IpcMapping&) = delete;
  IpcMapping& operator=(const IpcMapping&) = delete;
  CUdeviceptr get() const { return ptr_; }

 private:
  CUdeviceptr ptr_ = 0;
};

// A loaded module; unloaded on destruction. Move-only.
class Module {
 public:
  Module() = default;
  static StatusOr<Module> Load(const std::string& image);
  ~Module();
  Module(Module&& o) noexcept : mod_(std::exchange(o.mod_, nullptr)) {}
  Module& operator=(Module&& o) noexcept;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  CUmodule get() const { return mod_; }
  StatusOr<CUfunction> Function(const std::string& name) const;

 private:
  CUmodule mod_ = nullptr;
};

// A CUDA event; destroyed on destruction. Move-only.
class Event {
 public:
  Event() = default;
  static StatusOr<Event> Create();
  ~Event();
  Event(Event&& o) noexcept : ev_(std::exchange(o.ev_, nullptr)) {}
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  CUevent get() const { return ev_; }

 private:
  CUevent ev_ = nullptr;
};

// Retains device 0's primary context and makes it current on the calling
// thread; released on destruction. Call MakeCurrent() on other threads.
class PrimaryContext {
 public:
  PrimaryContext() = default;
  static StatusOr<PrimaryContext> Open(int device_ordinal);
  ~PrimaryContext();
  PrimaryContext(PrimaryContext&& o) noexcept
      : dev_(std::exchange(o.dev_, -1)), ctx_(std::exchange(o.ctx_, nullptr)) {}
  PrimaryContext& operator=(PrimaryContext&& o) noexcept;
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;
  Status MakeCurrent() const;
  CUdevice device() const { return dev_; }

 private:
  CUdevice dev_ = -1;
  CUcontext ctx_ = nullptr;
};

// Device facts for plans, prompts and reports.
struct DeviceInfo {
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  int64_t l2_bytes = 0;
  int64_t shared_per_block_optin = 0;
  int64_t total_memory = 0;
  // What one SM offers, for occupancy (0: the driver did not say).
  int registers_per_sm = 0;
  int max_registers_per_block = 0;
  int64_t shared_per_sm = 0;
  int64_t reserved_shared_per_block = 0;
  int max_threads_per_sm = 0;
  int max_blocks_per_sm = 0;
  std::string pci_bus_id;  // "0000:1B:00.0": names one GPU whatever a process's device numbering
  std::string Arch() const { return "sm_" + std::to_string(sm_major) + std::to_string(sm_minor); }
};
StatusOr<DeviceInfo> QueryDevice(CUdevice dev);
// Whether two PCI bus ids name one GPU (hex digits in either case).
bool SameBusId(const std::string& a, const std::string& b);

}  // namespace ks
