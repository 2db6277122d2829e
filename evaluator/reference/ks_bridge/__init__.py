"""The reference bridge's work, one module per concern, behind bridge.py's
command line (which alone is run; these modules import nothing of torch until
called, so that a missing torch is reported by bridge.py's main):

  errors          exit codes, BridgeError, the answer channel
  meta            the meta device (shapes without computing)
  problem_file    loading a problem file and running its code (model, inputs, forward)
  signature       inputs, parameters and outputs by name, dtype and shape
  flops           the FLOP count for the compute floor
  judge           the judging constants shared with the C++ evaluator (tolerances, contracts, bound blocks)
  rounding        the float64 run's machinery and budget, PyTorch's default precision (TF32),
                  the settings a baseline is timed under per precision contract
  truth           each set's float64 truth and PyTorch's per-block error from it per precision level
  checks          tolerance, degenerate and near-degenerate outputs, determinism
  resident        references kept on the GPU (CUDA IPC) and how many sets fit
  keeper          a resident reference kept between commands (--keep-reference), leased over a Unix socket
  compile_helper  torch.compile compiled and timed in a helper process
  reference_sets  the input sets, the distribution-shifted ones, timing, the manifest

A module imports only from those above it in this list (errors first), and
never from bridge.py.
"""
