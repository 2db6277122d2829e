#include "evaluator/cuda_driver.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include <dlfcn.h>

#include <map>
#include <mutex>

namespace ks {
namespace {

using GetProcFn = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);

// The ABI we ask cuGetProcAddress for. Asking for the toolkit's own version
// returns the newest variant of each entry point, whose signature can differ
// from the prototype the name declares (CUDA 13: cuCtxSynchronize resolves to
// cuCtxSynchronize_v2(CUcontext)). At 12.0 every entry point we use has the
// signature of its cuda.h prototype (or of the _vN its macro names).
constexpr int kAbiVersion = 12000;

StatusOr<const CudaDriver*> LoadOnce() {
  // Never dlclose'd: the driver stays for the life of the process.
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    return FailedPrecondition(std::string("no NVIDIA driver: cannot load libcuda.so.1 (") + (e ? e : "?") +
                              "); GPU evaluation needs a machine with an NVIDIA GPU");
  }
  auto get_proc = reinterpret_cast<GetProcFn>(dlsym(h, "cuGetProcAddress_v2"));
  if (!get_proc) return FailedPrecondition("libcuda.so.1 has no cuGetProcAddress_v2 (driver older than CUDA 12)");
  auto* d = new CudaDriver();
  std::string missing;
#define KS_CU_FN(name)                                                                            \
  {                                                                                               \
    void* fn = nullptr;                                                                           \
    CUdriverProcAddressQueryResult q;                                                             \
    if (get_proc(#name, &fn, kAbiVersion, CU_GET_PROC_ADDRESS_DEFAULT, &q) != CUDA_SUCCESS || !fn) \
      missing += std::string(" ") + #name;                                                        \
    d->name = reinterpret_cast<decltype(d->name)>(fn);                                            \
  }
#include "evaluator/cuda_driver_fns.inc"
#undef KS_CU_FN
  if (!missing.empty()) {
    delete d;
    return FailedPrecondition("the NVIDIA driver lacks entry points:" + missing + " (driver too old for CUDA " +
                              std::to_string(CUDA_VERSION) + "?)");
  }
  CUresult r = d->cuInit(0);
  if (r != CUDA_SUCCESS) {
    std::string name = d->ErrorName(r);
    delete d;
    return FailedPrecondition("cuInit failed: " + name + " (no usable GPU?)");
  }
  int count = 0;
  if (d->cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
    delete d;
    return FailedPrecondition("the NVIDIA driver sees no GPU");
  }
  return static_cast<const CudaDriver*>(d);
}

}  // namespace

StatusOr<const CudaDriver*> CudaDriver::Get() {
  static StatusOr<const CudaDriver*>* loaded = nullptr;
  static std::once_flag once;
  std::call_once(once, [] { loaded = new StatusOr<const CudaDriver*>(LoadOnce()); });
  return *loaded;
}

std::string CudaDriver::ErrorName(CUresult r) const {
  const char* name = nullptr;
  const char* desc = nullptr;
  if (cuGetErrorName) cuGetErrorName(r, &name);
  if (cuGetErrorString) cuGetErrorString(r, &desc);
  std::string out = name ? name : ("CUresult " + std::to_string(static_cast<int>(r)));
  if (desc) out += std::string(" (") + desc + ")";
  return out;
}

Status CudaDriver::Check(CUresult r, const char* what) const {
  if (r == CUDA_SUCCESS) return Status::Ok();
  Code code = r == CUDA_ERROR_OUT_OF_MEMORY ? Code::kResourceExhausted : Code::kInternal;
  return Status(code, std::string(what) + ": " + ErrorName(r));
}

bool GpuAvailable(std::string* why) {
  auto d = CudaDriver::Get();
  if (!d.ok() && why) *why = d.status().message();
  return d.ok();
}

StatusOr<std::string> DetectArch() {
  KS_ASSIGN_OR_RETURN(const CudaDriver* d, CudaDriver::Get());
  CUdevice dev;
  KS_RETURN_IF_ERROR(d->Check(d->cuDeviceGet(&dev, 0), "cuDeviceGet"));
  KS_ASSIGN_OR_RETURN(DeviceInfo info, QueryDevice(dev));
  return info.Arch();
}

StatusOr<DeviceInfo> QueryDevice(CUdevice dev) {
  KS_ASSIGN_OR_RETURN(const CudaDriver* d, CudaDriver::Get());
  DeviceInfo info;
  char name[256] = {0};
  KS_RETURN_IF_ERROR(d->Check(d->cuDeviceGetName(name, sizeof name, dev), "cuDeviceGetName"));
  info.name = name;
  int v = 0;
  auto attr = [&](CUdevice_attribute a) {
    v = 0;
    d->cuDeviceGetAttribute(&v, a, dev);
    return v;
  };
  info.sm_major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  info.sm_minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  info.multiprocessors = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  info.l2_bytes = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  info.shared_per_block_optin = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  info.registers_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR);
  info.max_registers_per_block = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
  info.shared_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
  info.reserved_shared_per_block = attr(CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK);
  info.max_threads_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
  info.max_blocks_per_sm = attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR);
  size_t total = 0;
  d->cuDeviceTotalMem(&total, dev);
  info.total_memory = static_cast<int64_t>(total);
  char bus[32] = {0};
  if (d->cuDeviceGetPCIBusId(bus, sizeof bus, dev) == CUDA_SUCCESS) info.pci_bus_id = bus;
  return info;
}

bool SameBusId(const std::string& a, const std::string& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

StatusOr<DeviceBuffer> DeviceBuffer::Alloc(size_t bytes) {
  KS_ASSIGN_OR_RETURN(const CudaDriver* d, CudaDriver::Get());
  DeviceBuffer b;
  KS_RETURN_IF_ERROR(d->Check(d->cuMemAlloc(&b.ptr_, bytes ? bytes : 1), "cuMemAlloc").WithContext(
      std::to_string(bytes) + " bytes"));
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) (*CudaDriver::Get())->cuMemFree(ptr_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) (*CudaDriver::Get())->cuMemFree(ptr_);
    ptr_ = std::exchange(o.ptr_, 0);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

StatusOr<IpcMapping> IpcMapping::Open(const std::string& handle) {
  KS_ASSIGN_OR_RETURN(const CudaDriver* d, CudaDriver::Get());
  CUipcMemHandle h;
  if (handle.size() != sizeof h)
    return InvalidArgument("a CUDA IPC handle has " + std::to_string(sizeof h) + " bytes, not " +
                           std::to_string(handle.size()));
  std::memcpy(&h, handle.data(), sizeof h);
  IpcMapping m;
  KS_RETURN_IF_ERROR(d->Check(d->cuIpcOpenMemHandle(&m.ptr_, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                              "cuIpcOpenMemHandle"));
  return m;
}

IpcMapping::~IpcMapping() {
  if (ptr_) (*CudaDriver::Get())->cuIpcCloseMemHandle(ptr_);
}

IpcMapping& IpcMapping::operator=(IpcMapping&& o) noexcept {
  if (this != &o) {
    if (ptr_) (*CudaDriver::Get())->cuIpcCloseMemHandle(ptr_);
    ptr_ = std::exchange(o.ptr_, 0);
  }
  return *this;
}

StatusOr<Module> Module::Load(const std::string& image) {
  KS_ASSIGN_OR_RETURN(const CudaDriver* d, CudaDriver::Get());
  Module m;
  KS_RETURN_IF_ERROR(d->Check(d->cuModuleLoadData(&m.mod_, image.data()), "cuModuleLoadData"));
  return m;
}

Module::~Module() {
  if (mod_) (*CudaDriver::Get())->cuModuleUnload(mod_);
}

Module& Module::operator=(Module&& o) noexcept {
  if (this != &o) {
    if (mod_) (*CudaDriver::Get())->cuModuleUnload(mod_);
    mod_ = std::exchange(o.mod_, nullptr);
  }
  return *this;
}

StatusOr<CUfunction> Module::Function(const std::string& name) const {
  KS_ASSIGN_OR_RETURN(const CudaDriver* d, CudaDriver::Get());
  CUfunction f;
  KS_RETURN_IF_ERROR(d->Check(d->cuModuleGetFunction(&f, mod_, name.c_str()), ("cuModuleGetFunction " + name).c_str()));
  return f;
}

StatusOr<Event> Event::Create() {
  KS_ASSIGN_OR_RETURN(const CudaDriver* d, CudaDriver::Get());
  Event e;
  KS_RETURN_IF_ERROR(d->Check(d->cuEventCreate(&e.ev_, CU_EVENT_DEFAULT), "cuEventCreate"));
  return e;
}

Event::~Event() {
  if (ev_) (*CudaDriver::Get())->cuEventDestroy(ev_);
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (ev_) (*CudaDriver::Get())->cuEventDestroy(ev_);
    ev_ = std::exchange(o.ev_, nullptr);
  }
  return *this;
}

StatusOr<PrimaryContext> PrimaryContext::Open(int ordinal) {
  KS_ASSIGN_OR_RETURN(const CudaDriver* d, CudaDriver::Get());
  PrimaryContext p;
  KS_RETURN_IF_ERROR(d->Check(d->cuDeviceGet(&p.dev_, ordinal), "cuDeviceGet"));
  KS_RETURN_IF_ERROR(d->Check(d->cuDevicePrimaryCtxRetain(&p.ctx_, p.dev_), "cuDevicePrimaryCtxRetain"));
  KS_RETURN_IF_ERROR(p.MakeCurrent());
  return p;
}

StatusOr<uint64_t> FreeDeviceMemory(int device_ordinal) {
  KS_ASSIGN_OR_RETURN(const CudaDriver* d, CudaDriver::Get());
  KS_ASSIGN_OR_RETURN(PrimaryContext ctx, PrimaryContext::Open(device_ordinal));
  // The context stays retained for the process: the evaluator that follows on
  // this device takes it at once instead of creating it again (a tenth of a
  // second each way). Never destroyed: the driver ends it with the process.
  static std::mutex mu;
  static auto* held = new std::map<int, PrimaryContext>();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!held->count(device_ordinal)) {
      auto again = PrimaryContext::Open(device_ordinal);
      if (again.ok()) held->emplace(device_ordinal, std::move(again).value());
    }
  }
  size_t free_bytes = 0, total = 0;
  KS_RETURN_IF_ERROR(d->Check(d->cuMemGetInfo(&free_bytes, &total), "cuMemGetInfo"));
  return static_cast<uint64_t>(free_bytes);
}

Status PrimaryContext::MakeCurrent() const {
  KS_ASSIGN_OR_RETURN(const CudaDriver* d, CudaDriver::Get());
  return d->Check(d->cuCtxSetCurrent(ctx_), "cuCtxSetCurrent");
}

PrimaryContext::~PrimaryContext() {
  if (ctx_) (*CudaDriver::Get())->cuDevicePrimaryCtxRelease(dev_);
}

PrimaryContext& PrimaryContext::operator=(PrimaryContext&& o) noexcept {
  if (this != &o) {
    if (ctx_) (*CudaDriver::Get())->cuDevicePrimaryCtxRelease(dev_);
    dev_ = std::exchange(o.dev_, -1);
    ctx_ = std::exchange(o.ctx_, nullptr);
  }
  return *this;
}

}  // namespace ks
