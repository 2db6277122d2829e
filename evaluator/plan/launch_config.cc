#include "evaluator/plan/launch_config.h"

namespace ks {
namespace {

// The config cuLaunchKernelEx and cuOccupancyMaxActiveClusters take; `attr`
// must outlive it.
CUlaunchConfig ConfigFor(const wire::LaunchShape& s, CUstream stream, CUlaunchAttribute* attr) {
  CUlaunchConfig cfg{};
  cfg.gridDimX = s.grid[0];
  cfg.gridDimY = s.grid[1];
  cfg.gridDimZ = s.grid[2];
  cfg.blockDimX = s.block[0];
  cfg.blockDimY = s.block[1];
  cfg.blockDimZ = s.block[2];
  cfg.sharedMemBytes = s.shared_bytes;
  cfg.hStream = stream;
  if (s.cluster) {
    attr->id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr->value.clusterDim.x = (*s.cluster)[0];
    attr->value.clusterDim.y = (*s.cluster)[1];
    attr->value.clusterDim.z = (*s.cluster)[2];
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  return cfg;
}

unsigned ClusterSize(const wire::LaunchShape& s) {
  return s.cluster ? (*s.cluster)[0] * (*s.cluster)[1] * (*s.cluster)[2] : 0;
}

}  // namespace

Status PrepareFunction(const CudaDriver& d, CUfunction fn, const wire::LaunchShape& s, const std::string& kernel) {
  // Clusters above 8 blocks are legal on sm_90 only once the kernel opts in;
  // the plan parser allows up to 16 (PlanLimits::max_cluster_size).
  if (ClusterSize(s) > 8) {
    CUresult r = d.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1);
    if (r != CUDA_SUCCESS)
      return FailedPrecondition(kernel + ": this GPU does not allow clusters of more than 8 blocks: " + d.ErrorName(r));
  }
  if (s.shared_bytes > 48 * 1024) {
    CUresult r = d.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, s.shared_bytes);
    if (r != CUDA_SUCCESS)
      return FailedPrecondition(kernel + ": cannot raise dynamic shared memory to " + std::to_string(s.shared_bytes) +
                                " bytes: " + d.ErrorName(r));
  }
  return Status::Ok();
}

CUresult Launch(const CudaDriver& d, CUfunction fn, const wire::LaunchShape& s, void** params, CUstream stream) {
  if (!s.cluster)
    return d.cuLaunchKernel(fn, s.grid[0], s.grid[1], s.grid[2], s.block[0], s.block[1], s.block[2], s.shared_bytes,
                            stream, params, nullptr);
  CUlaunchAttribute attr;
  CUlaunchConfig cfg = ConfigFor(s, stream, &attr);
  return d.cuLaunchKernelEx(&cfg, fn, params, nullptr);
}

wire::Occupancy QueryOccupancy(const CudaDriver& d, CUfunction fn, const wire::LaunchShape& s) {
  wire::Occupancy o;
  o.threads = static_cast<int>(s.block[0] * s.block[1] * s.block[2]);
  o.dynamic_shared = s.shared_bytes;
  if (d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&o.blocks_per_sm, fn, o.threads, s.shared_bytes) != CUDA_SUCCESS)
    o.blocks_per_sm = -1;
  if (d.cuFuncGetAttribute(&o.registers, CU_FUNC_ATTRIBUTE_NUM_REGS, fn) != CUDA_SUCCESS) o.registers = -1;
  if (d.cuFuncGetAttribute(&o.static_shared, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn) != CUDA_SUCCESS)
    o.static_shared = -1;
  // A cluster's blocks must be resident together on one GPC, which the
  // per-SM figure cannot show: ask how many clusters fit on the whole GPU.
  if (s.cluster) {
    CUlaunchAttribute attr;
    CUlaunchConfig cfg = ConfigFor(s, nullptr, &attr);
    o.cluster_size = static_cast<int>(ClusterSize(s));
    if (d.cuOccupancyMaxActiveClusters(&o.max_active_clusters, fn, &cfg) != CUDA_SUCCESS) o.max_active_clusters = -1;
  }
  return o;
}

StatusOr<CUtensorMap> EncodeTensorMap(const CudaDriver& d, const TensorMapSpec& m, CUdeviceptr address) {
  KS_RETURN_IF_ERROR(CheckTensorMapAddress(m, address));
  CUtensorMap out;
  CUresult r = d.cuTensorMapEncodeTiled(
      &out, static_cast<CUtensorMapDataType>(m.dtype), static_cast<cuuint32_t>(m.rank), reinterpret_cast<void*>(address),
      m.dims.data(), m.byte_strides.data(), m.box.data(), m.element_strides.data(),
      static_cast<CUtensorMapInterleave>(m.interleave), static_cast<CUtensorMapSwizzle>(m.swizzle),
      static_cast<CUtensorMapL2promotion>(m.l2_promotion), static_cast<CUtensorMapFloatOOBfill>(m.oob_fill));
  if (r != CUDA_SUCCESS)
    return InvalidArgument("the driver refuses the map (cuTensorMapEncodeTiled: " + d.ErrorName(r) + ")");
  return out;
}

}  // namespace ks
