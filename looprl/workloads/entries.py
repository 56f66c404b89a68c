"""One row of a dataset: a contraction, and where it comes from when it comes from a model."""

from __future__ import annotations

from dataclasses import dataclass

from looprl.ir.epilogue import as_epilogue
from looprl.ir.problem import Problem, contraction, matmul

MATMUL_SPEC = "mk,kn->mn"


@dataclass(frozen=True)
class DatasetEntry:
    """A contraction of a dataset (``spec`` and ``sizes`` as (dimension, size) pairs) with the
    model layer it was derived from: ``model`` (e.g. ``"bert-base"``), ``layer`` (e.g.
    ``"seq128/ffn.up"``, several names joined by ", " when layers share the shape) and a short
    ``derivation`` of the sizes. The three are None for the synthetic grids. ``epilogue``: the
    key of the element-wise epilogue the layer applies to its output (e.g. ``"bias+gelu"``,
    see :class:`~looprl.ir.epilogue.Epilogue`), or None for a bare contraction. ``constant``:
    the inputs that are weights (e.g. ``("in1",)``) and ``cold``: the weight read from memory
    on every call (:meth:`~looprl.ir.problem.Problem.with_cold`), for a layer as a model calls
    it (the ``models-called`` dataset)."""

    spec: str
    sizes: tuple[tuple[str, int], ...]
    model: str | None = None
    layer: str | None = None
    derivation: str | None = None
    epilogue: str | None = None
    constant: tuple[str, ...] = ()
    cold: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.spec, str):
            raise ValueError(f"a dataset entry's spec must be a string, got {self.spec!r}")
        sizes = dict(self.sizes)
        object.__setattr__(self, "sizes", tuple(sizes.items()))
        for field in ("model", "layer", "derivation"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"a dataset entry's {field} must be a non-empty string or None, got {value!r}")
        if self.epilogue is not None:
            if not isinstance(self.epilogue, str):
                raise ValueError(f"a dataset entry's epilogue must be an epilogue key (e.g. 'bias+gelu') or None, got {self.epilogue!r}")
            key = as_epilogue(self.epilogue).key
            object.__setattr__(self, "epilogue", key or None)  # canonical; the identity is None
        object.__setattr__(self, "constant", tuple(self.constant))
        if not isinstance(self.cold, bool):
            raise ValueError(f"a dataset entry's cold must be true or false, got {self.cold!r}")
        self.problem  # noqa: B018 - validates spec and sizes now, with the problem's own message

    @property
    def problem(self) -> Problem:
        """The :class:`Problem`: :func:`matmul` for ``"mk,kn->mn"`` (so names stay as the
        grids' always were), else :func:`contraction`; with the entry's epilogue."""
        sizes = dict(self.sizes)
        if self.spec == MATMUL_SPEC and set(sizes) == {"m", "n", "k"} and not self.constant and not self.cold:
            return matmul(m=sizes["m"], n=sizes["n"], k=sizes["k"], epilogue=self.epilogue)
        return contraction(self.spec, sizes, epilogue=self.epilogue, constant=self.constant, cold=self.cold)  # also: a ValueError naming what is wrong

    def size(self, dim: str) -> int:
        return dict(self.sizes)[dim]

    @property
    def macs(self) -> int:
        """Multiply-adds: the product of every extent (the batch included)."""
        total = 1
        for _, value in self.sizes:
            total *= value
        return total

    def to_row(self) -> dict:
        """The JSON row of a model dataset (model, layer, derivation, spec, sizes, and the
        epilogue only when there is one)."""
        row = {"model": self.model, "layer": self.layer, "derivation": self.derivation, "spec": self.spec, "sizes": dict(self.sizes)}
        if self.epilogue is not None:
            row["epilogue"] = self.epilogue
        if self.constant:
            row["constant"] = list(self.constant)
        if self.cold:
            row["cold"] = True
        return row

    @classmethod
    def from_row(cls, row: dict, spec: str | None = None) -> "DatasetEntry":
        """An entry from a stored row: a model row (with ``spec`` and ``sizes``) or a grid row
        (``{"m": .., "n": .., "k": ..}``, whose ``spec`` is the dataset's)."""
        if not isinstance(row, dict):
            raise ValueError(f"a dataset row must be a JSON object, got {row!r}")
        if "sizes" in row:
            sizes = row["sizes"]
            if not isinstance(sizes, dict):
                raise ValueError(f"a dataset row's sizes must be an object of dimension: size, got {sizes!r}")
            constant = row.get("constant", [])
            if not isinstance(constant, list):
                raise ValueError(f"a dataset row's constant must be a list of input names, got {constant!r}")
            return cls(row.get("spec", spec), tuple(sizes.items()), row.get("model"), row.get("layer"), row.get("derivation"),
                       row.get("epilogue"), tuple(constant), row.get("cold", False))
        if spec is None:
            raise ValueError(f"dataset row {row!r} names no spec and its dataset has none")
        return cls(spec, tuple(row.items()))
