"""Tuned looprl kernels inside a PyTorch model: :func:`tune_module`.

This package imports torch (nothing else of looprl does, outside :mod:`looprl.train` and the
``torch.compile`` backend :mod:`looprl.dynamo`); importing ``looprl`` does not import it.

``tune_module(module, example_inputs)`` runs the module once per example under
``torch.no_grad()``, recording with forward hooks the input shape every ``torch.nn.Linear``
sees; then each float32 CPU ``nn.Linear`` that saw float32 CPU inputs gets looprl kernels
tuned (:func:`looprl.tune` of :func:`looprl.linear`) for a set of row counts (the leading
dimensions of its input flattened: a ``(batch, seq, features)`` input is ``batch * seq`` rows),
with its weight and bias bound as constants. A module that is itself such a layer is replaced
whole; a module in which no layer was tuned is returned as a copy, with a warning.

**Any row count.** The row counts tuned are every power of two up to ``max_rows`` (default:
the largest row count the examples gave the layer) and the examples' own counts: a schedule
tuned for 1 row (a decode step streams the weights) is not the schedule for 64 or 4096 rows
(register tiles, cache blocks). Each tuned schedule is compiled a second time as a kernel of
*runtime rows* (``looprl.compile(..., runtime_rows=True)``: the row count is an argument, the
remainder rows run specialised copies of the register tile), so one call of the kernel tuned
for ``c`` rows serves any count up to ``c``. A call on ``r`` rows runs on consecutive row
blocks (:func:`row_plan`): whole blocks of the largest count, then usually one call of the
smallest tuned count that covers the rest (100 rows: one call of the 128-row kernel; 5 rows:
one of the 8-row kernel, reading the weights once), the plan of least time by the kernels'
measured times. A schedule that cannot take its rows at run time (one that converts the
input to a layout) pads a shorter block into a buffer of its count instead. The cost is
tuning: one tune per power of two, ``log2(max_rows) + 1`` per
distinct layer shape. In an ``nn.Sequential``, an ``nn.ReLU``,
``nn.GELU`` (either approximation) or ``nn.SiLU`` right after such a linear layer is fused into
its kernel's epilogue for that sequence (the activation module stays; the sequence becomes a
``FusedSequential`` that runs the pair as one call; the layer called alone still computes the
linear layer alone). Layers with hooks, parametrizations, pruning or weight norm are left to
torch (``stats()["left_to_torch"]`` says why), and so are a subclass of ``nn.Linear`` and a layer
whose ``forward`` is replaced on the instance; an activation that is a subclass, or whose
``forward`` is replaced, is not fused (one rule: :func:`~looprl.torch.activations.not_its_class`).
Everything else stays as it was. The module returned is a copy (the given one, and torch's
random generator, are left as they were, bit for bit); its tuned layers are
:class:`TunedLinear` modules (see :func:`tuned_layers`).

A tuned layer runs its kernel only when that gives exactly the layer's function on this input;
otherwise it falls back to the original ``nn.Linear`` (and activation), so a call never gives
a wrong answer:

* an input that is not float32, not on the CPU, or whose last dimension is not
  ``in_features`` (the original layer then raises what it raises);
* autograd: grad mode on and the input or a parameter requiring grad (the kernels have no
  backward), e.g. training;
* a tensor subclass, a zero-size input;
* a tensor of a ``torch.func`` transform (``vmap``, ``grad``, ``jvp``, ``functionalize``: a
  batched tensor has no memory of its own), :data:`~looprl.torch.routes.TRANSFORMED`;
* CPU autocast on with a dtype other than the layer's (a float32 layer under
  ``torch.autocast("cpu", dtype=torch.bfloat16)``): torch's call computes it in autocast's
  dtype and returns that, as the original does (:data:`~looprl.torch.routes.AUTOCAST`); a
  bfloat16 layer under bfloat16 autocast keeps its kernels.

**Never slower than torch.** Once a layer shape is tuned, its looprl plan and torch's own call
(``functional.linear`` and the activation: what the original layer runs) are timed against each
other at every tuned row count, in interleaved rounds until the two are told apart (the rule
of :func:`~looprl.torch.routes.shown_faster`: looprl's only where a sign test is 95% sure it
wins rounds by 5%, at most 15 rounds, and its best time is 5% below torch's; a tie is torch's),
with the layer's weight (copies of it in turn where the rows are tuned cold), under the
threads torch is set to (:meth:`LinearKernels.judge`); a row count torch keeps, and any row
count next to one, is
computed by torch's call (:meth:`LinearKernels.runs_torch`). ``tune_module`` prints a line per
layer shape as it is tuned and a table of these timings at the end (:func:`route_table`). Then
the tuned model is timed against the model on each example by the same rule (a 1% margin:
:data:`~looprl.torch.module.MODEL_MARGIN`), and where it is not shown faster, the row counts
that example gave each layer go to torch too (a layer judged alone has its weights warm in the
cache; in a model the other layers compete for it).
``compare_torch=False`` keeps every call looprl's.

:func:`stats` counts, per layer and in all, the calls a looprl kernel served and the calls that
fell back, by reason (a call routed to torch: :data:`TORCH_FASTER`), and each layer's routes. Non-contiguous inputs are copied into a contiguous tensor first. Every
call computes with the weight and bias the layer holds at that moment: the call compares them,
element by element, with the values the kernels were bound to, and binds them again if they
differ, however they were changed (``.data`` edits, ``load_state_dict``, an optimiser step, a
replaced Parameter, numpy writes; see :class:`ContentCache`, and its cost). A module may be
called from several threads at once.

The package, by job: :mod:`~looprl.torch.module` (:func:`tune_module`: examples, fusions, the
whole-model check), :mod:`~looprl.torch.layers` (a layer's problems and its one tune loop,
:func:`~looprl.torch.layers.tune_layer`; :class:`TunedLinear`), :mod:`~looprl.torch.routes`
(:class:`LinearKernels`: the call, its row plans, looprl against torch), :mod:`~looprl.torch.rows`
(row plans), :mod:`~looprl.torch.weights` (when the kernels are bound to the weights again),
:mod:`~looprl.torch.activations` (the fused activations' one table) and
:mod:`~looprl.torch.records` (:func:`stats`, :func:`route_table`, :func:`save_records`).
"""

from looprl.torch.activations import ACTIVATIONS
from looprl.torch.layers import COLD_ROWS, TunedLinear, layer_problem, layer_shape, tune_layer, weight_bytes
from looprl.torch.module import MODEL_BUDGET_S, MODEL_MARGIN, MODEL_ROUNDS, MODEL_TOLERANCE, tune_module
from looprl.torch.records import kernels_by_shape, route_summary, route_table, save_records, stats, summarise_calls, tuned_layers
from looprl.torch.routes import (ROUTE_BUDGET_S, ROUTE_CONFIDENCE, ROUTE_MARGIN, ROUTE_MAX_ROUNDS, TORCH_FASTER, Duel, LinearKernels, Route,
                                 faster, interleaved_best_seconds, interleaved_duels, shown_faster)
from looprl.torch.rows import CALL_S, any_rows_kernel, block_seconds, check_max_rows, row_plan, tuned_row_counts
from looprl.torch.weights import ContentCache, FrozenCache

__all__ = ["LinearKernels", "Route", "TunedLinear", "route_table", "row_plan", "save_records", "stats", "tune_module", "tuned_layers"]
