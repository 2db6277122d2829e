// The GPU worker's request loop (`ks-worker serve`). Runs in its own sandboxed
// process: it maps the evaluator's shared arena (inputs, parameters, outputs)
// through CUDA IPC, loads one candidate module at a time and runs its launch plan
// on request, timing each run with device events. It never sees reference
// outputs: they live only in the trusted process's own allocations.
//
// Started as `serve --device N`, it first opens GPU N's primary context and
// sends one message (an EmptyReply, or a fatal ErrorReply and exit), then
// reads requests (typed structs with one encoding,
// evaluator/worker/worker_protocol.h): init, load (the module, the resolved plan, its scratch and TMA tensor maps,
// which are encoded here since a map holds an address of this process), run,
// warm, unload, quit. A sticky CUDA error (illegal address, ...) is reported and then the
// worker exits: its context is unusable, and the evaluator starts a new one.
#pragma once

namespace ks {

int WorkerServe(int argc, char** argv);

}  // namespace ks
