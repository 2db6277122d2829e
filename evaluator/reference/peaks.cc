// The GPU's measured peaks (problem.h: MeasureDevicePeaks): bridge.py peaks
// times dense matrix products per compute class, cached per device.
#include <cctype>
#include <cmath>
#include <filesystem>
#include <system_error>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "evaluator/reference/bridge_internal.h"
#include "evaluator/problem.h"

namespace ks {
namespace fs = std::filesystem;
using nlohmann::json;
using bridge_internal::RunBridge;

double DevicePeaks::For(const std::string& compute_class) const {
  auto it = tflops.find(compute_class);
  return it == tflops.end() ? 0 : it->second;
}

std::string ComputeClassFor(const Signature& signature) {
  for (const auto& o : signature.outputs) {
    if (o.is_scalar || !IsFloating(o.dtype)) continue;
    switch (o.dtype) {
      case DType::kFloat32: return "fp32";
      case DType::kFloat16: return "fp16";
      case DType::kBFloat16: return "bf16";
      case DType::kFloat64: return "fp64";
      default: break;
    }
  }
  return "";
}

namespace {

// Bridge output or cache file -> DevicePeaks; every class present must be a
// positive finite number.
StatusOr<DevicePeaks> PeaksFromJson(const json& j, const std::string& what) {
  if (!j.is_object() || !j.contains("tflops") || !j["tflops"].is_object() || j["tflops"].empty())
    return Internal(what + ": no \"tflops\" object");
  DevicePeaks p;
  p.device = j.value("device", "");
  p.torch_version = j.value("torch", "");
  p.n = j.value("n", 0);
  for (const auto& [k, v] : j["tflops"].items()) {
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
      return Internal(what + ": tflops." + k + " is not a positive number");
    p.tflops[k] = v.get<double>();
  }
  return p;
}

std::string CacheFileName(const std::string& device_name) {
  std::string out;
  for (char c : device_name) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.') ? c : '_';
  return (out.empty() ? "device" : out) + ".json";
}

}  // namespace

StatusOr<DevicePeaks> MeasureDevicePeaks(const PeaksOptions& opts) {
  if (opts.device_index < 0) return InvalidArgument("the device index must be >= 0");
  const fs::path dir = opts.cache_dir.empty() ? fs::path(DefaultReferenceCacheDir()) / "peaks" : fs::path(opts.cache_dir);
  const std::string key = opts.device_name.empty() ? "cuda" + std::to_string(opts.device_index) : opts.device_name;
  const fs::path file = dir / CacheFileName(key);
  std::error_code ec;
  if (!opts.refresh && fs::exists(file, ec)) {
    auto text = ReadFile(file.string(), 1 << 20);
    if (text.ok()) {
      json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
      auto p = PeaksFromJson(j, file.string());
      if (p.ok() && (opts.device_name.empty() || p->device == opts.device_name)) {
        p->from_cache = true;
        return p;
      }
    }
    // Damaged or for another device: measured again below and overwritten.
  }
  KS_ASSIGN_OR_RETURN(json j, RunBridge("peaks", {"peaks", "--index", std::to_string(opts.device_index), "--n",
                                                  std::to_string(opts.n), "--runs", std::to_string(opts.runs)},
                                        opts.bridge));
  KS_ASSIGN_OR_RETURN(DevicePeaks p, PeaksFromJson(j, "bridge.py peaks"));
  if (!opts.device_name.empty() && p.device != opts.device_name)
    return Internal("bridge.py peaks measured CUDA device " + std::to_string(opts.device_index) + " as '" + p.device +
                    "', but the driver calls it '" + opts.device_name +
                    "' (do torch and the driver number devices differently? check CUDA_DEVICE_ORDER)");
  fs::create_directories(dir, ec);
  if (ec) return PosixError(dir.string(), ec.value());
  KS_RETURN_IF_ERROR(WriteFile(file.string(), j.dump(1) + "\n"));
  return p;
}

}  // namespace ks
