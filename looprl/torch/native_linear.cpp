// looprl's linear operator called without Python: looprl_native::linear(x, weight, bias, layer).
//
// The backend (looprl.dynamo) puts this operator in the graphs it hands Inductor. A call whose
// layer has a plan for its row count, on tensors the plan was made for, runs the plan's kernels
// here: addresses read from the tensors, the kernels (looprl's JIT code) called by address.
// Every other call is the Python operator's (looprl::linear, redispatched to its CPU kernel;
// looprl_native::try_linear, a module's, returns None for it to compute in Python),
// which computes it, counts it, and may hand this table a plan for its row count
// (looprl.torch.native). The table is written only from Python and read on every call.
//
// A row count that the layer routes to torch (torch timed faster there) and whose layer has no
// activation gets a plan that is torch's own call, aten::linear, made here (as the Python
// operator's functional.linear makes it): a routed call costs a table lookup above torch's
// call, not the dispatcher's way into Python and back. Such calls are counted apart.
//
// A plan is a list of kernel calls (parts), each over a run of rows, its kernel serial or a team's
// (offered only where looprl does not place its teams: on torch's OpenMP runtime, as in a torch
// process, or with LOOPRL_PLACE_TEAMS=0). Each pointer argument of a
// part's kernel is the input x, the output, this thread's workspace, the weight or the bias as
// passed to this call (a kernel that reads them in place), or an address fixed when the plan was
// made (a copy of the weight bound to the kernel: then the plan holds only for that weight
// tensor, seen as when the plan was made, or, for a layer that follows its weights, while the
// weight and bias hold the bytes the copies were made from; Python keeps what the plan points at
// alive until the plan is dropped). Plans are dropped under the table's lock, which calls hold while
// they run: once looprl_native_clear returns, no call still reads what the plan pointed at.
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/GradMode.h>
#include <torch/library.h>

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

// Declared as ATen/autocast_mode.h declares it (libtorch_cpu exports it; the torch version is
// part of the built library's key): reading that header, and ATen/ops/empty.h for at::empty,
// was 12 of the compiler's 19 s on a Zen 3, paid once per torch installation.
namespace at::autocast {
TORCH_API bool is_autocast_enabled(at::DeviceType device_type);
}  // namespace at::autocast

namespace {

// Where a kernel's pointer argument comes from (the values of a part's `sources`).
enum Source : int64_t { kFixed = 0, kInput = 1, kOutput = 2, kWorkspace = 3, kWeight = 4, kBias = 5 };

constexpr int kMaxPointers = 6;

// One kernel call of a plan; laid out as looprl.torch.native.Part (ctypes) writes it.
struct Part {
  void* function;
  int64_t start;         // its first row
  int64_t length;        // its rows
  int64_t takes_rows;    // 1: the kernel takes the row count after reps
  int64_t threads;       // 0: a serial kernel; else it takes this thread count (i32) last
  int64_t pointers;      // its pointer arguments (4 to 6)
  int64_t sources[kMaxPointers];
  int64_t fixed[kMaxPointers];  // the address of a kFixed argument
};

struct Plan {
  std::vector<Part> parts;
  int64_t weight = 0;  // bound copies: the weight's and bias's data pointers the plan holds for (0: in place)
  int64_t bias = 0;
  int64_t workspace_bytes = 0;
  // Copies bound for a layer that follows its weights: the weight's and bias's contents when they
  // were bound (0: none); the plan holds while the tensors hold them, byte for byte (memcmp).
  int64_t kept_weight = 0, kept_bias = 0, weight_bytes = 0, bias_bytes = 0;
  int64_t pid = 0;  // a plan with a team's kernels: the process it was made in (a forked child's calls are Python's)
  bool torch = false;  // torch's call (aten::linear), the row count routed to torch; no parts
};

struct Layer {
  int64_t in_features = 0, out_features = 0;
  at::ScalarType dtype = at::kFloat;
  bool has_bias = false;
  std::unordered_map<int64_t, Plan> plans;  // row count -> plan
  std::atomic<int64_t> calls{0};            // calls this table computed (Python adds them to the layer's count)
  std::atomic<int64_t> torch_calls{0};      // calls this table gave torch's call (Python counts them as routed to torch)
};

std::shared_mutex table_lock;
std::unordered_map<int64_t, std::unique_ptr<Layer>> table;

// A thread's workspace, freed when the thread ends.
struct Scratch {
  void* buffer = nullptr;
  int64_t size = 0;
  ~Scratch() { std::free(buffer); }
};

// The workspace of this thread, at least `bytes`, page-aligned (what a kernel's `acc` needs), or
// null where it cannot be had (the call then goes to Python).
void* workspace(int64_t bytes) {
  thread_local Scratch scratch;
  if (bytes > scratch.size) {
    std::free(scratch.buffer);
    int64_t rounded = (bytes + 4095) / 4096 * 4096;
    scratch.buffer = std::aligned_alloc(4096, rounded);
    scratch.size = scratch.buffer ? rounded : 0;
  }
  return scratch.buffer;
}

using P = void*;
using I = int64_t;
using T = int32_t;

thread_local bool used_parallel = false;  // this thread has run a team's kernel (looprl_native_used_parallel)

// A kernel's entry point: its pointers, reps (1), then the row count where it takes one, then
// the thread count where it has a parallel loop (looprl.backend.abi).
void call_part(const Part& part, P* args) {
  const I reps = 1, rows = part.length;
  const T threads = static_cast<T>(part.threads);
  const bool team = part.threads != 0;
  if (team) used_parallel = true;
  void* f = part.function;
  P a = args[0], b = args[1], c = args[2], d = args[3], e = args[4], g = args[5];
  switch (part.pointers * 4 + part.takes_rows * 2 + team) {
    case 16: reinterpret_cast<void (*)(P, P, P, P, I)>(f)(a, b, c, d, reps); break;
    case 17: reinterpret_cast<void (*)(P, P, P, P, I, T)>(f)(a, b, c, d, reps, threads); break;
    case 18: reinterpret_cast<void (*)(P, P, P, P, I, I)>(f)(a, b, c, d, reps, rows); break;
    case 19: reinterpret_cast<void (*)(P, P, P, P, I, I, T)>(f)(a, b, c, d, reps, rows, threads); break;
    case 20: reinterpret_cast<void (*)(P, P, P, P, P, I)>(f)(a, b, c, d, e, reps); break;
    case 21: reinterpret_cast<void (*)(P, P, P, P, P, I, T)>(f)(a, b, c, d, e, reps, threads); break;
    case 22: reinterpret_cast<void (*)(P, P, P, P, P, I, I)>(f)(a, b, c, d, e, reps, rows); break;
    case 23: reinterpret_cast<void (*)(P, P, P, P, P, I, I, T)>(f)(a, b, c, d, e, reps, rows, threads); break;
    case 24: reinterpret_cast<void (*)(P, P, P, P, P, P, I)>(f)(a, b, c, d, e, g, reps); break;
    case 25: reinterpret_cast<void (*)(P, P, P, P, P, P, I, T)>(f)(a, b, c, d, e, g, reps, threads); break;
    case 26: reinterpret_cast<void (*)(P, P, P, P, P, P, I, I)>(f)(a, b, c, d, e, g, reps, rows); break;
    case 27: reinterpret_cast<void (*)(P, P, P, P, P, P, I, I, T)>(f)(a, b, c, d, e, g, reps, rows, threads); break;
  }
}

// A plain dense CPU tensor (no functorch wrapper, no Python subclass mode, no conjugate or
// negative bit): the dispatch keys of torch.empty's tensor, nothing else.
bool plain(const at::Tensor& t) {
  static const c10::DispatchKeySet allowed({c10::DispatchKey::CPU, c10::DispatchKey::ADInplaceOrView,
                                            c10::DispatchKey::AutogradCPU, c10::DispatchKey::AutocastCPU});
  return allowed.has_all(t.key_set()) && t.layout() == at::kStrided;
}

// The plan this call can run by, or null: the checks of LinearKernels.why_not and of a plan's
// weight, for what Python does not see here (anything not plain goes to Python, which decides).
const Plan* plan_for(const Layer& layer, const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  if (at::autocast::is_autocast_enabled(at::kCPU)) return nullptr;  // Python decides by autocast's dtype
  if (bias.has_value() != layer.has_bias) return nullptr;
  if (!plain(x) || x.scalar_type() != layer.dtype || x.dim() < 1 || x.size(-1) != layer.in_features || !x.is_contiguous()) return nullptr;
  if (!plain(weight) || weight.scalar_type() != layer.dtype || weight.dim() != 2 || weight.size(0) != layer.out_features ||
      weight.size(1) != layer.in_features || !weight.is_contiguous())
    return nullptr;
  if (bias.has_value()) {
    const at::Tensor& b = *bias;
    if (!plain(b) || b.scalar_type() != layer.dtype || b.dim() != 1 || b.size(0) != layer.out_features || !b.is_contiguous()) return nullptr;
  }
  if (c10::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad() || (bias.has_value() && bias->requires_grad())))
    return nullptr;
  int64_t numel = x.numel();
  if (numel == 0) return nullptr;
  auto found = layer.plans.find(numel / layer.in_features);
  if (found == layer.plans.end()) return nullptr;
  const Plan& plan = found->second;
  if (plan.pid != 0 && plan.pid != static_cast<int64_t>(getpid())) return nullptr;  // forked: Python refuses or runs it
  if (plan.weight != 0 && (reinterpret_cast<int64_t>(weight.const_data_ptr()) != plan.weight ||
                           (bias.has_value() && reinterpret_cast<int64_t>(bias->const_data_ptr()) != plan.bias)))
    return nullptr;
  if (plan.kept_weight != 0 &&
      (std::memcmp(weight.const_data_ptr(), reinterpret_cast<const void*>(plan.kept_weight), plan.weight_bytes) != 0 ||
       (bias.has_value() && std::memcmp(bias->const_data_ptr(), reinterpret_cast<const void*>(plan.kept_bias), plan.bias_bytes) != 0)))
    return nullptr;  // the weight or bias changed since its copies were bound: Python binds again
  return &plan;
}

at::Tensor run(const Layer& layer, const Plan& plan, const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  auto sizes = x.sizes().vec();
  sizes.back() = layer.out_features;
  at::Tensor out(at::detail::empty_cpu(sizes, x.options()));  // what at::empty does on the CPU, without dispatch
  const int64_t element = x.element_size();
  char* input = static_cast<char*>(const_cast<void*>(x.const_data_ptr()));
  char* output = static_cast<char*>(out.mutable_data_ptr());
  void* scratch = workspace(plan.workspace_bytes);
  void* given[6] = {nullptr, nullptr, nullptr, scratch, const_cast<void*>(weight.const_data_ptr()),
                    bias.has_value() ? const_cast<void*>(bias->const_data_ptr()) : nullptr};
  for (const Part& part : plan.parts) {
    given[kInput] = input + part.start * layer.in_features * element;
    given[kOutput] = output + part.start * layer.out_features * element;
    P args[kMaxPointers] = {};
    for (int64_t i = 0; i < part.pointers; ++i)
      args[i] = part.sources[i] == kFixed ? reinterpret_cast<P>(part.fixed[i]) : given[part.sources[i]];
    call_part(part, args);
  }
  return out;
}

// torch's own linear call, through the dispatcher (what functional.linear calls).
at::Tensor torch_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  static auto aten_linear = c10::Dispatcher::singleton()
                                .findSchemaOrThrow("aten::linear", "")
                                .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&)>();
  return aten_linear.call(x, weight, bias);
}

// The call by the layer's plan, or nothing where there is none for it.
std::optional<at::Tensor> try_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias, int64_t index) {
  std::shared_lock<std::shared_mutex> lock(table_lock);
  auto found = table.find(index);
  if (found == table.end()) return std::nullopt;
  Layer& layer = *found->second;
  const Plan* plan = plan_for(layer, x, weight, bias);
  if (plan != nullptr && plan->torch) {
    layer.torch_calls.fetch_add(1, std::memory_order_relaxed);
    return torch_linear(x, weight, bias);
  }
  if (plan == nullptr || workspace(plan->workspace_bytes) == nullptr) return std::nullopt;
  at::Tensor out = run(layer, *plan, x, weight, bias);
  layer.calls.fetch_add(1, std::memory_order_relaxed);
  return out;
}

// A graph's call: by the plan, else the Python operator's.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias, int64_t index) {
  std::optional<at::Tensor> planned = try_linear(x, weight, bias, index);
  if (planned.has_value()) return *std::move(planned);
  static auto python = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("looprl::linear", "")
                           .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, int64_t)>();
  return python.redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), x, weight, bias, index);
}

}  // namespace

TORCH_LIBRARY(looprl_native, m) {
  m.def("linear(Tensor x, Tensor weight, Tensor? bias, int layer) -> Tensor", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(linear)));
  // A module's call (TunedLinear): by the plan, or None, and the module computes it in Python.
  m.def("try_linear(Tensor x, Tensor weight, Tensor? bias, int layer) -> Tensor?",
        torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(try_linear)));
}

// The table's writers, called from Python (ctypes).
extern "C" {

// Declare a layer (index as the graph passes it), dropping any plans it had.
void looprl_native_layer(int64_t index, int64_t in_features, int64_t out_features, int64_t bfloat16, int64_t has_bias) {
  auto layer = std::make_unique<Layer>();
  layer->in_features = in_features;
  layer->out_features = out_features;
  layer->dtype = bfloat16 ? at::kBFloat16 : at::kFloat;
  layer->has_bias = has_bias != 0;
  std::unique_lock<std::shared_mutex> lock(table_lock);
  table[index] = std::move(layer);
}

// Give a layer a plan for `rows` rows; 0 if the layer is not declared.
int64_t looprl_native_plan(int64_t index, int64_t rows, const Part* parts, int64_t count, int64_t weight, int64_t bias,
                           int64_t workspace_bytes, const int64_t* kept) {
  Plan plan;
  plan.parts.assign(parts, parts + count);
  plan.kept_weight = kept[0];
  plan.kept_bias = kept[1];
  plan.weight_bytes = kept[2];
  plan.bias_bytes = kept[3];
  for (const Part& part : plan.parts)
    if (part.threads != 0) plan.pid = static_cast<int64_t>(getpid());
  plan.weight = weight;
  plan.bias = bias;
  plan.workspace_bytes = workspace_bytes;
  std::unique_lock<std::shared_mutex> lock(table_lock);
  auto found = table.find(index);
  if (found == table.end()) return 0;
  found->second->plans[rows] = std::move(plan);
  return 1;
}

// Route a layer's `rows` rows to torch's call (a plan that is aten::linear); 0 if the layer is not declared.
int64_t looprl_native_torch_route(int64_t index, int64_t rows) {
  Plan plan;
  plan.torch = true;
  std::unique_lock<std::shared_mutex> lock(table_lock);
  auto found = table.find(index);
  if (found == table.end()) return 0;
  found->second->plans[rows] = std::move(plan);
  return 1;
}

// Drop every plan of a layer (its calls go to Python again); returns once no call runs one.
void looprl_native_clear(int64_t index) {
  std::unique_lock<std::shared_mutex> lock(table_lock);
  auto found = table.find(index);
  if (found != table.end()) found->second->plans.clear();
}

// Forget a layer; returns the calls it computed not yet taken (and in `torch_calls` those it gave torch).
int64_t looprl_native_forget(int64_t index, int64_t* torch_calls) {
  std::unique_lock<std::shared_mutex> lock(table_lock);
  *torch_calls = 0;
  auto found = table.find(index);
  if (found == table.end()) return 0;
  int64_t calls = found->second->calls.exchange(0);
  *torch_calls = found->second->torch_calls.exchange(0);
  table.erase(found);
  return calls;
}

// Whether the calling thread has run a team's kernel here (a process forked from it cannot run
// parallel regions: looprl.backend.threads asks after a fork).
int64_t looprl_native_used_parallel() { return used_parallel ? 1 : 0; }

// The calls a layer computed since last asked (and in `torch_calls` those it gave torch; then counted afresh).
int64_t looprl_native_take_calls(int64_t index, int64_t* torch_calls) {
  std::shared_lock<std::shared_mutex> lock(table_lock);
  *torch_calls = 0;
  auto found = table.find(index);
  if (found == table.end()) return 0;
  *torch_calls = found->second->torch_calls.exchange(0);
  return found->second->calls.exchange(0);
}

}  // extern "C"
