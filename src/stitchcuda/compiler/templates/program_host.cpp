// StitchCUDA's program host: the torch side of every generated program, one source for all of them.
//
// A program's own build is its kernel library (program.cu.j2): CUDA and the CUDA libraries' C APIs
// behind a table of entry points, no torch header, so nvcc compiles only its kernels. This file is
// what torch's headers are needed for, and it is the same for every program, so a machine builds it
// once. For each call of a program it:
// - checks the arguments (CUDA tensors on one device, their dtypes, contiguous, the shapes the
//   program was generated for), allocating nothing for it;
// - allocates the returned tensors fresh, and takes the intermediate buffers and the libraries'
//   workspaces from a per-device state made on the device's first call and kept;
// - remakes the program's packed weights when a tensor they come from has moved storage or version;
// - runs the launches on the caller's stream, directly or through a CUDA graph: the forward is
//   captured into a graph keyed by every pointer it touches (arguments, fresh outputs, buffers)
//   once a key is seen a second time, and replayed on the caller's stream for later calls with the
//   same key. Where the inputs' or outputs' addresses are new each call, a staged graph reads the
//   program's own copies of the inputs and writes its own output buffers, one copy per tensor in and
//   out (where those copies cost less than the launches they save). A replay recomputes everything
//   from the current contents of the inputs: nothing is cached across calls. Capture
//   happens on a pool stream that runs no work (capture only records). cuBLAS is captured with a
//   workspace owned by the state, so nothing is allocated inside the capture; the handle goes back
//   to torch's stream, workspace and math mode afterwards.
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/autograd/python_variable.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/accumulate.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace stitchcuda_host {

// The layout program.cu.j2 writes (its ScProgramTable).
struct ProgramTable {
  int64_t abi;
  int64_t pointers;
  int (*create)(void** state, int64_t* workspace_bytes);
  int (*bind)(void* state, void* const* workspaces);
  int (*launch)(void* state, void* const* pointers, void* stream, void* blas, void* blas_workspace,
                int64_t blas_workspace_bytes);
  int (*pack)(void* state, void* const* pointers, void* stream);
  void (*destroy)(void* state);
  const char* (*error)();
};
constexpr int64_t kAbi = 1;
constexpr size_t kGraphs = 8;
constexpr size_t kSeen = 32;
constexpr int64_t kBlasWorkspaceBytes = 32ll << 20;

#define SC_CUDA_CHECK(expr)                                                                        \
  do {                                                                                             \
    const cudaError_t sc_err_ = (expr);                                                            \
    TORCH_CHECK(sc_err_ == cudaSuccess, "stitchcuda: ", #expr, " failed: ", cudaGetErrorString(sc_err_)); \
  } while (0)

at::ScalarType dtype_named(const std::string& name) {
  if (name == "float") return at::kFloat;
  if (name == "int64_t") return at::kLong;
  if (name == "int32_t") return at::kInt;
  if (name == "bool") return at::kBool;
  TORCH_CHECK(false, "stitchcuda: a program tensor of unknown element type ", name);
}

std::vector<at::ScalarType> dtypes_named(const std::vector<std::string>& names) {
  std::vector<at::ScalarType> out;
  for (const auto& n : names) out.push_back(dtype_named(n));
  return out;
}

using Key = std::vector<void*>;

// A program's state on one GPU.
struct Device {
  const ProgramTable* table = nullptr;
  void* state = nullptr;
  std::vector<at::Tensor> buffers;     // the intermediates, kept between calls
  std::vector<at::Tensor> workspaces;  // cuBLASLt's, cuDNN's, CUTLASS's (undefined where none)
  std::vector<at::Tensor> staged_outputs;  // the staged graph's outputs (run), made at its first need
  std::vector<at::Tensor> staged_inputs;   // ... and the copies of the forward's inputs it reads
  Key staged_key;                          // ... and that graph, apart from the per-address ones
  cudaGraphExec_t staged_exec = nullptr;
  cudaStream_t capture_stream = nullptr;
  at::Tensor blas_workspace;
  std::vector<std::pair<Key, cudaGraphExec_t>> graphs;  // most recent last
  std::vector<Key> seen;
  std::vector<std::pair<const void*, int64_t>> pack_key;  // the packed weights' data_ptr and _version
  // ... and the tensors themselves: while held, their memory cannot go to another tensor, so an equal
  // data_ptr is the same storage (a model built after another was freed can get the freed model's
  // addresses and version counts, and would otherwise be served the freed model's packs)
  std::vector<at::Tensor> pack_held;

  ~Device() {
    // at interpreter exit CUDA may already be gone: the process's end frees everything anyway
#if PY_VERSION_HEX >= 0x030D0000
    if (Py_IsFinalizing()) return;
#else
    if (_Py_IsFinalizing()) return;
#endif
    for (auto& g : graphs) cudaGraphExecDestroy(g.second);
    if (staged_exec != nullptr) cudaGraphExecDestroy(staged_exec);
    if (state != nullptr) table->destroy(state);
  }
};

class Program {
 public:
  Program(int64_t table, std::vector<std::string> names, std::vector<std::vector<int64_t>> arg_shapes,
          std::vector<std::string> arg_types, std::vector<std::vector<int64_t>> buffer_shapes,
          std::vector<std::string> buffer_types, std::vector<std::vector<int64_t>> output_shapes,
          std::vector<std::string> output_types, std::vector<int64_t> packed, std::vector<int64_t> staged,
          int64_t stage_bytes, bool graph, bool blas, bool realign)
      : table_(reinterpret_cast<const ProgramTable*>(table)),
        names_(std::move(names)),
        arg_shapes_(std::move(arg_shapes)),
        arg_types_(dtypes_named(arg_types)),
        buffer_shapes_(std::move(buffer_shapes)),
        buffer_types_(dtypes_named(buffer_types)),
        output_shapes_(std::move(output_shapes)),
        output_types_(dtypes_named(output_types)),
        packed_(std::move(packed)),
        staged_(std::move(staged)),
        graph_(graph),
        blas_(blas),
        realign_(realign) {
    TORCH_CHECK(table_ != nullptr && table_->abi == kAbi, "stitchcuda: the kernel library's table is not version ",
                kAbi, " (a program built by another StitchCUDA)");
    TORCH_CHECK(!names_.empty() && arg_shapes_.size() == names_.size() && arg_types_.size() == names_.size(),
                "stitchcuda: a program's argument spec is inconsistent");
    TORCH_CHECK(table_->pointers ==
                    static_cast<int64_t>(names_.size() + buffer_shapes_.size() + output_shapes_.size()),
                "stitchcuda: the kernel library takes ", table_->pointers, " pointers; the spec names ",
                names_.size() + buffer_shapes_.size() + output_shapes_.size());
    TORCH_CHECK(!output_shapes_.empty(), "stitchcuda: a program returns at least one tensor");
    for (int64_t i : packed_)
      TORCH_CHECK(i >= 0 && i < static_cast<int64_t>(names_.size()), "stitchcuda: packed argument ", i);
    int64_t copied = 0;  // a staged call's copies, in and out: the shapes are the program's own
    for (int64_t i : staged_) {
      TORCH_CHECK(i >= 0 && i < static_cast<int64_t>(names_.size()), "stitchcuda: staged argument ", i);
      const auto k = static_cast<size_t>(i);
      copied += c10::multiply_integers(arg_shapes_[k]) * static_cast<int64_t>(c10::elementSize(arg_types_[k]));
    }
    for (size_t i = 0; i < output_shapes_.size(); ++i)
      copied += c10::multiply_integers(output_shapes_[i]) * static_cast<int64_t>(c10::elementSize(output_types_[i]));
    stage_ = copied <= stage_bytes;
  }

  py::object forward(py::handle tuple_handle) {
    PyObject* tuple = tuple_handle.ptr();
    TORCH_CHECK(PyTuple_Check(tuple), "stitchcuda: forward takes one tuple of tensors");
    const Py_ssize_t count = PyTuple_GET_SIZE(tuple);
    TORCH_CHECK(count == static_cast<Py_ssize_t>(names_.size()), "stitchcuda: expected ", names_.size(),
                " tensors, got ", count);
    args_.assign(static_cast<size_t>(count), nullptr);
    realigned_.clear();
    if (realign_) realigned_.reserve(static_cast<size_t>(count));  // no reallocation: pointers into it are kept
    for (Py_ssize_t i = 0; i < count; ++i) {
      PyObject* item = PyTuple_GET_ITEM(tuple, i);
      TORCH_CHECK(THPVariable_Check(item), "stitchcuda: argument ", i, " is not a tensor");
      const at::Tensor* t = &THPVariable_Unpack(item);  // the tuple keeps it alive
      if (realign_ && t->defined() && (reinterpret_cast<uintptr_t>(t->data_ptr()) & 15u) != 0) {
        // CUTLASS's operands must be 16-byte aligned: a view at an odd offset is copied
        realigned_.push_back(t->clone());
        t = &realigned_.back();
      }
      args_[static_cast<size_t>(i)] = t;
    }
    const at::Tensor& first = *args_[0];
    TORCH_CHECK(first.is_cuda(), "stitchcuda: ", names_[0], " must be a CUDA tensor");
    const int device = first.get_device();
    for (size_t i = 0; i < args_.size(); ++i)
      check_arg(*args_[i], names_[i].c_str(), arg_shapes_[i], arg_types_[i], device);
    const c10::cuda::CUDAGuard guard(first.device());
    Device& d = device_for(first);
    const auto opts = first.options();
    std::vector<at::Tensor> outputs;
    outputs.reserve(output_shapes_.size());
    for (size_t i = 0; i < output_shapes_.size(); ++i)
      outputs.push_back(at::empty(output_shapes_[i], opts.dtype(output_types_[i])));
    Key& p = pointers_;
    p.clear();
    for (const at::Tensor* t : args_) p.push_back(t->data_ptr());
    for (const at::Tensor& t : d.buffers) p.push_back(t.data_ptr());
    for (const at::Tensor& t : outputs) p.push_back(t.data_ptr());
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
    if (!packed_.empty()) refresh_packs(d, stream);
    run(d, stream, outputs);
    args_.clear();
    realigned_.clear();
    if (outputs.size() == 1) return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(outputs[0])));
    py::tuple result(outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i)
      result[i] = py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(outputs[i])));
    return result;
  }

 private:
  // No heap allocation on the way: a call checks every argument, and a whole model has hundreds
  static void check_arg(const at::Tensor& t, const char* name, const std::vector<int64_t>& shape,
                        at::ScalarType dtype, int device) {
    TORCH_CHECK(t.is_cuda(), "stitchcuda: ", name, " must be a CUDA tensor");
    TORCH_CHECK(t.get_device() == device, "stitchcuda: ", name, " is on another device");
    TORCH_CHECK(t.scalar_type() == dtype, "stitchcuda: ", name, " must be ", dtype, ", got ", t.scalar_type());
    TORCH_CHECK(t.is_contiguous(), "stitchcuda: ", name, " must be contiguous");
    TORCH_CHECK(t.sizes() == c10::IntArrayRef(shape), "stitchcuda: ", name, " has shape ", t.sizes(),
                "; this program was generated for ", c10::IntArrayRef(shape));
  }

  void check(int status) const { TORCH_CHECK(status == 0, table_->error()); }

  Device& device_for(const at::Tensor& like) {
    const int dev = like.get_device();
    TORCH_CHECK(dev >= 0 && dev < static_cast<int>(devices_.size()), "stitchcuda: unexpected device index ", dev);
    std::unique_ptr<Device>& slot = devices_[static_cast<size_t>(dev)];
    if (slot) return *slot;
    auto made = std::make_unique<Device>();
    made->table = table_;
    const auto opts = like.options();
    for (size_t i = 0; i < buffer_shapes_.size(); ++i)
      made->buffers.push_back(at::empty(buffer_shapes_[i], opts.dtype(buffer_types_[i])));
    std::array<int64_t, 3> bytes{};
    check(table_->create(&made->state, bytes.data()));
    std::array<void*, 3> workspaces{};
    for (size_t i = 0; i < bytes.size(); ++i) {
      made->workspaces.emplace_back();
      if (bytes[i] > 0) {
        made->workspaces.back() = at::empty({bytes[i]}, opts.dtype(at::kByte));
        workspaces[i] = made->workspaces.back().data_ptr();
      }
    }
    check(table_->bind(made->state, workspaces.data()));
    if (graph_) {
      made->capture_stream = at::cuda::getStreamFromPool(false, dev).stream();
      if (blas_) made->blas_workspace = at::empty({kBlasWorkspaceBytes}, opts.dtype(at::kByte));
    }
    slot = std::move(made);
    return *slot;
  }

  void launch(Device& d, cudaStream_t stream, void* blas_workspace, const Key& pointers) {
    void* blas = blas_ ? static_cast<void*>(at::cuda::getCurrentCUDABlasHandle()) : nullptr;
    check(table_->launch(d.state, pointers.data(), stream, blas, blas_workspace,
                         blas_workspace != nullptr ? kBlasWorkspaceBytes : 0));
  }

  // The forward's launches: replayed from a graph captured for these pointers once they come a
  // second time. A caller that passes a fresh input every call (a data loader), or whose other work
  // allocates between calls (a benchmark beside eager, a training loop) and so moves the fresh
  // outputs, would never see a graph per address replayed: then the staged graph runs, the same
  // launches over the program's own copies of the inputs and into its own output buffers, one copy
  // a tensor in and out (a few microseconds, where launching a model's kernels one by one costs a
  // hundred). The staged graph's key still holds the weights' and buffers' addresses.
  void run(Device& d, cudaStream_t stream, const std::vector<at::Tensor>& outputs) {
    if (!graph_) {
      launch(d, stream, nullptr, pointers_);
      return;
    }
    cudaStreamCaptureStatus outer = cudaStreamCaptureStatusNone;
    SC_CUDA_CHECK(cudaStreamIsCapturing(stream, &outer));
    if (outer != cudaStreamCaptureStatusNone) {  // the caller is capturing a graph itself: just record into it
      launch(d, stream, nullptr, pointers_);
      return;
    }
    if (replay(d, pointers_, stream)) return;
    if (sighted(d, pointers_)) {
      replay(d, capture(d, pointers_), stream);
      return;
    }
    if (!stage_) {  // copies dearer than the launches they save
      launch(d, stream, nullptr, pointers_);
      return;
    }
    Key staged = pointers_;  // the arguments first, the outputs last
    for (size_t j = 0; j < staged_.size(); ++j) {
      const at::Tensor& input = *args_[static_cast<size_t>(staged_[j])];
      if (d.staged_inputs.size() <= j) d.staged_inputs.push_back(at::empty(input.sizes(), input.options()));
      staged[static_cast<size_t>(staged_[j])] = d.staged_inputs[j].data_ptr();
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (d.staged_outputs.size() <= i) d.staged_outputs.push_back(at::empty(outputs[i].sizes(), outputs[i].options()));
      staged[staged.size() - outputs.size() + i] = d.staged_outputs[i].data_ptr();
    }
    if (d.staged_exec == nullptr || d.staged_key != staged) {
      if (!sighted(d, staged)) {  // the first call: no graph yet
        launch(d, stream, nullptr, pointers_);
        return;
      }
      if (d.staged_exec != nullptr) cudaGraphExecDestroy(d.staged_exec);  // freed once its launches finish
      d.staged_exec = nullptr;  // a capture that throws leaves none
      d.staged_exec = instantiate(d, staged);
      d.staged_key = staged;
    }
    for (size_t j = 0; j < staged_.size(); ++j) {
      const at::Tensor& input = *args_[static_cast<size_t>(staged_[j])];
      SC_CUDA_CHECK(cudaMemcpyAsync(d.staged_inputs[j].data_ptr(), input.data_ptr(), input.nbytes(),
                                    cudaMemcpyDeviceToDevice, stream));
    }
    SC_CUDA_CHECK(cudaGraphLaunch(d.staged_exec, stream));
    for (size_t i = 0; i < outputs.size(); ++i)
      SC_CUDA_CHECK(cudaMemcpyAsync(outputs[i].data_ptr(), d.staged_outputs[i].data_ptr(), outputs[i].nbytes(),
                                    cudaMemcpyDeviceToDevice, stream));
  }

  // Launches the graph kept for `key`; false where there is none.
  static bool replay(Device& d, const Key& key, cudaStream_t stream) {
    for (auto& g : d.graphs) {
      if (g.first == key) {
        SC_CUDA_CHECK(cudaGraphLaunch(g.second, stream));
        return true;
      }
    }
    return false;
  }

  // Whether `key` came before (among the last kSeen); remembered either way.
  static bool sighted(Device& d, const Key& key) {
    if (std::find(d.seen.begin(), d.seen.end(), key) != d.seen.end()) return true;
    if (d.seen.size() >= kSeen) d.seen.erase(d.seen.begin());
    d.seen.push_back(key);
    return false;
  }

  // Captures the launches for `key` into a graph kept among the last kGraphs; returns the key.
  const Key& capture(Device& d, const Key& key) {
    cudaGraphExec_t exec = instantiate(d, key);
    if (d.graphs.size() >= kGraphs) {  // freed by CUDA once its pending launches finish
      cudaGraphExecDestroy(d.graphs.front().second);
      d.graphs.erase(d.graphs.begin());
    }
    d.graphs.emplace_back(key, exec);
    return d.graphs.back().first;
  }

  // The launches for `key`, captured on the state's stream and instantiated.
  cudaGraphExec_t instantiate(Device& d, const Key& key) {
    cudaGraph_t graph = nullptr;
    SC_CUDA_CHECK(cudaStreamBeginCapture(d.capture_stream, cudaStreamCaptureModeThreadLocal));
    try {
      launch(d, d.capture_stream, blas_ ? d.blas_workspace.data_ptr() : nullptr, key);
    } catch (...) {
      cudaStreamEndCapture(d.capture_stream, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
      if (blas_) at::cuda::getCurrentCUDABlasHandle();  // back to torch's stream, workspace and math mode
      throw;
    }
    SC_CUDA_CHECK(cudaStreamEndCapture(d.capture_stream, &graph));
    if (blas_) at::cuda::getCurrentCUDABlasHandle();
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    SC_CUDA_CHECK(made);
    return exec;
  }

  void refresh_packs(Device& d, cudaStream_t stream) {
    bool same = d.pack_key.size() == packed_.size();
    for (size_t i = 0; same && i < packed_.size(); ++i) {
      const at::Tensor& t = *args_[static_cast<size_t>(packed_[i])];
      same = t.data_ptr() == d.pack_key[i].first && t._version() == d.pack_key[i].second;
    }
    if (same) return;
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    SC_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
    check(table_->pack(d.state, pointers_.data(), stream));
    // inside a caller's graph capture nothing runs now: the pack is recorded into that graph, and
    // the next direct call packs again
    d.pack_key.clear();
    d.pack_held.clear();
    if (capturing != cudaStreamCaptureStatusNone) return;
    for (int64_t i : packed_) {
      const at::Tensor& t = *args_[static_cast<size_t>(i)];
      d.pack_key.emplace_back(t.data_ptr(), t._version());
      d.pack_held.push_back(t);
    }
  }

  const ProgramTable* table_;
  std::vector<std::string> names_;
  std::vector<std::vector<int64_t>> arg_shapes_;
  std::vector<at::ScalarType> arg_types_;
  std::vector<std::vector<int64_t>> buffer_shapes_;
  std::vector<at::ScalarType> buffer_types_;
  std::vector<std::vector<int64_t>> output_shapes_;
  std::vector<at::ScalarType> output_types_;
  std::vector<int64_t> packed_;  // the arguments the packed weights come from
  std::vector<int64_t> staged_;  // the forward's own inputs, which the staged graph reads copies of
  bool stage_ = false;           // whether a staged call's copies stay within the spec's stage_bytes
  bool graph_, blas_, realign_;
  std::array<std::unique_ptr<Device>, 64> devices_;
  // this call's: the arguments, their aligned copies, the pointers in the kernel library's order
  std::vector<const at::Tensor*> args_;
  std::vector<at::Tensor> realigned_;
  Key pointers_;
};

}  // namespace stitchcuda_host

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using stitchcuda_host::Program;
  // module-local: the same host built in two folders (a harness that builds each program apart)
  // loads twice into one process, and a global type of one name cannot register twice
  py::class_<Program>(m, "Program", py::module_local())
      .def(py::init<int64_t, std::vector<std::string>, std::vector<std::vector<int64_t>>, std::vector<std::string>,
                    std::vector<std::vector<int64_t>>, std::vector<std::string>, std::vector<std::vector<int64_t>>,
                    std::vector<std::string>, std::vector<int64_t>, std::vector<int64_t>, int64_t, bool, bool,
                    bool>());
  m.def("forward", [](Program& program, py::handle args) { return program.forward(args); },
        "one call of the program: its tensors as one tuple");
}
