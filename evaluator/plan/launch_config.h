// One place that turns a launch's shape (grid, block, dynamic shared memory,
// cluster) into driver calls: the attributes a kernel needs before it can be
// launched that way, the launch itself, and the driver's occupancy figures
// for it. The worker uses it for every launch of a plan, so a new launch
// attribute is added here once. Stateless; thread-safe as the driver is.
#pragma once

#include <string>

#include "common/status.h"
#include "evaluator/cuda_driver.h"
#include "evaluator/worker/worker_protocol.h"

namespace ks {

// Raises the dynamic shared-memory limit above the 48 KiB default and allows
// clusters of more than 8 blocks, as the shape asks. A refusal names the kernel.
Status PrepareFunction(const CudaDriver& d, CUfunction fn, const wire::LaunchShape& shape, const std::string& kernel);

// cuLaunchKernel, or cuLaunchKernelEx with the cluster attribute.
CUresult Launch(const CudaDriver& d, CUfunction fn, const wire::LaunchShape& shape, void** params, CUstream stream);

// Resident blocks per SM (and clusters on the GPU) at this shape, with the
// attributes that decide it.
wire::Occupancy QueryOccupancy(const CudaDriver& d, CUfunction fn, const wire::LaunchShape& shape);

// The descriptor of a checked map (tensor_map.h) over device memory at
// `address` in the current context: the address rule first, then the driver's
// cuTensorMapEncodeTiled, whose refusal is InvalidArgument "the driver refuses
// the map (cuTensorMapEncodeTiled: <CUresult name>)".
StatusOr<CUtensorMap> EncodeTensorMap(const CudaDriver& d, const TensorMapSpec& m, CUdeviceptr address);

}  // namespace ks
