"""Data layouts of a tensor (ALT's layout primitives): immutable values and pure transforms.

A tensor indexed by letters (e.g. ``"kn"``) is stored row-major by default. A :class:`Layout`
describes another arrangement of the same elements as a list of *physical dimensions*, each a
list of *atoms*; an atom is a piece of one logical index ``x`` of a dimension ``var``:

* ``value = x // step`` for the *outer* atom of ``var`` (it holds the highest part of x),
* ``value = (x // step) % count`` for every other atom of ``var``;

and ``extent >= count`` is the room the atom takes (more than ``count``: padding). The atoms
are stored row-major in order: the offset of an element is ``sum(value * stride)`` where an
atom's stride is the product of the extents of the atoms after it. The primitives:

* :meth:`Layout.split` ``(i, f)``: physical dimension ``i`` (one atom) becomes an outer
  dimension and an inner one of ``f`` values (``x = outer * f + inner``); a size ``f`` does not
  divide leaves the last outer block partly unused (padding, never read);
* :meth:`Layout.reorder` ``(perm)``: permute the physical dimensions;
* :meth:`Layout.fuse` ``(i)``: merge physical dimensions ``i`` and ``i + 1`` (addresses are
  unchanged; a fused dimension can no longer be split or padded, as in ALT);
* :meth:`Layout.pad` ``(i, multiple)``: round the extent of dimension ``i`` (one atom) up to a
  multiple (changes the strides of the dimensions before it).

Offsets are separable: ``offset = sum over vars of g_var(x_var)``; :meth:`Layout.offset`
gives ``g_var``. :meth:`Layout.breakpoints` are the positions where ``g_var`` stops being
affine (multiples of every split step and period); the code generator uses them to decide
whether a loop schedule walks the layout affinely.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from looprl import checks

PAIR = 2  # indices of a reduction a bfloat16 kernel loads as one 32-bit lane (looprl.backend.pairs)
_ATOM_RE = re.compile(r"([a-z])([0-9]+)(?:%([0-9]+))?(?:p([0-9]+))?", re.ASCII)


@dataclass(frozen=True)
class Atom:
    """One piece of a logical index: ``(x // step) [% count]``, taking ``extent`` places."""

    var: str
    step: int
    count: int
    extent: int
    outer: bool

    def value(self, x: int) -> int:
        return x // self.step if self.outer else (x // self.step) % self.count

    @property
    def key(self) -> str:
        text = f"{self.var}{self.step}"
        if not self.outer:
            text += f"%{self.count}"
        if self.extent != self.count:
            text += f"p{self.extent}"
        return text


@dataclass(frozen=True)
class Layout:
    """How the elements of a tensor indexed by ``index`` (sizes ``sizes``) are stored."""

    index: str
    sizes: tuple[int, ...]
    dims: tuple[tuple[Atom, ...], ...]

    @staticmethod
    def row_major(index: str, sizes: tuple[int, ...]) -> "Layout":
        sizes = tuple(int(s) for s in sizes)
        return Layout(index, sizes, tuple((Atom(v, 1, n, n, True),) for v, n in zip(index, sizes)))

    @staticmethod
    def from_key(index: str, sizes: tuple[int, ...], key: str) -> "Layout":
        """The layout whose :attr:`key` is ``key`` (validated: every element of the tensor
        has its own place)."""
        sizes = tuple(int(s) for s in sizes)
        dims = []
        for part in key.split("."):
            atoms = []
            for item in part.split("*"):
                match = _ATOM_RE.fullmatch(item)
                if match is None:
                    raise ValueError(f"bad atom {item!r} in layout {key!r}: expected <dim><step>[%<count>][p<extent>]")
                var, step, count, extent = match.groups()
                if var not in index:
                    raise ValueError(f"layout {key!r}: dimension {var!r} is not an index of {index!r}")
                step = int(step)
                if step < 1:
                    raise ValueError(f"layout {key!r}: atom {item!r} has step 0")
                outer = count is None
                count = -(-sizes[index.index(var)] // step) if outer else int(count)
                extent = int(extent) if extent is not None else count
                if count < 1 or extent < count:
                    raise ValueError(f"layout {key!r}: atom {item!r} has fewer places than values")
                atoms.append(Atom(var, step, count, extent, outer))
            dims.append(tuple(atoms))
        layout = Layout(index, sizes, tuple(dims))
        layout._check(key)
        return layout

    def reindexed(self, index: str, sizes: tuple[int, ...]) -> "Layout":
        """The same physical arrangement for a tensor of the same dimensions indexed in another
        order (``"nk"`` instead of ``"kn"``): the atoms, which name dimensions by letter, stay;
        only the logical index they are read through changes."""
        sizes = tuple(int(s) for s in sizes)
        if sorted(index) != sorted(self.index) or dict(zip(index, sizes)) != dict(zip(self.index, self.sizes)):
            raise ValueError(f"layout of {self.index} {self.sizes} cannot be read as one of {index} {sizes}: not the same dimensions")
        layout = Layout(index, sizes, self.dims)
        layout._check(layout.key)
        return layout

    def _check(self, key: str) -> None:
        """Each var: one outer atom, and atoms whose steps chain (step * count = next step)."""
        for var, size in zip(self.index, self.sizes):
            atoms = sorted((a for a in self.atoms if a.var == var), key=lambda a: a.step)
            if not atoms or atoms[0].step != 1 or not atoms[-1].outer or any(a.outer for a in atoms[:-1]):
                raise ValueError(f"layout {key!r} of {self.index!r}: dimension {var!r} must have pieces of steps 1, ... ending with one outer piece")
            for lower, upper in zip(atoms, atoms[1:]):
                if lower.step * lower.count != upper.step:
                    raise ValueError(f"layout {key!r} of {self.index!r}: the pieces of {var!r} do not chain (step x count = next step)")
            if atoms[-1].count != -(-size // atoms[-1].step):
                raise ValueError(f"layout {key!r} of {self.index!r}: the outer piece of {var!r} does not cover its {size} elements")

    # -- views -------------------------------------------------------------------------
    @cached_property
    def atoms(self) -> tuple[Atom, ...]:
        return tuple(a for dim in self.dims for a in dim)

    @cached_property
    def key(self) -> str:
        return ".".join("*".join(a.key for a in dim) for dim in self.dims)

    @property
    def is_row_major(self) -> bool:
        return self == Layout.row_major(self.index, self.sizes)

    @cached_property
    def strides(self) -> tuple[int, ...]:
        """Element stride of each atom (in :attr:`atoms` order)."""
        result, running = [], 1
        for atom in reversed(self.atoms):
            result.append(running)
            running *= atom.extent
        return tuple(reversed(result))

    @cached_property
    def elements(self) -> int:
        """Places the layout takes (padding included)."""
        total = 1
        for atom in self.atoms:
            total *= atom.extent
        return total

    def offset(self, var: str, x: int) -> int:
        """``g_var(x)``: the part of an element's offset that index ``x`` of ``var`` gives."""
        return sum(a.value(x) * s for a, s in zip(self.atoms, self.strides) if a.var == var)

    def breakpoints(self, var: str) -> tuple[int, ...]:
        """Where ``g_var`` is not affine: multiples of these (sorted; each divides the next)."""
        found = set()
        for atom in self.atoms:
            if atom.var != var:
                continue
            if atom.step > 1:
                found.add(atom.step)
            if not atom.outer:
                found.add(atom.step * atom.count)
        return tuple(sorted(found))

    def describe(self) -> str:
        return f"{self.index}[{self.key}]"

    # -- primitives ----------------------------------------------------------------------
    def _dim(self, i, what: str) -> int:
        i = checks.integer(i, "layout dimension")
        if not 0 <= i < len(self.dims):
            raise ValueError(f"cannot {what} dimension {i} of layout {self.key!r}: it has {len(self.dims)} dimensions")
        return i

    def split(self, i: int, factor: int) -> "Layout":
        i = self._dim(i, "split")
        factor = checks.integer(factor, "layout split factor")
        why = self.why_not_split(i, factor)
        if why is not None:
            raise ValueError(why)
        atom = self.dims[i][0]
        count = -(-atom.count // factor)
        outer = Atom(atom.var, atom.step * factor, count, count, atom.outer)
        inner = Atom(atom.var, atom.step, factor, factor, False)
        return Layout(self.index, self.sizes, self.dims[:i] + ((outer,), (inner,)) + self.dims[i + 1 :])

    def why_not_split(self, i: int, factor: int) -> str | None:
        """Why :meth:`split` refuses physical dimension ``i`` (in range) by ``factor``, or None."""
        if len(self.dims[i]) != 1:
            return f"cannot split dimension {i} of layout {self.key!r}: it is fused"
        atom = self.dims[i][0]
        if factor < 2 or factor >= atom.count:
            return f"cannot split dimension {i} ({atom.key}) of layout {self.key!r} by {factor}: need 2 <= factor < {atom.count}"
        if not atom.outer and atom.count % factor:
            return f"cannot split dimension {i} ({atom.key}) of layout {self.key!r} by {factor}: it does not divide {atom.count}"
        if atom.extent != atom.count:
            return f"cannot split dimension {i} ({atom.key}) of layout {self.key!r}: it is padded"
        return None

    def reorder(self, perm) -> "Layout":
        try:
            perm = tuple(checks.integer(p, "layout permutation entry") for p in perm)
        except TypeError:
            raise ValueError(f"a layout permutation must be a sequence of integers, got {perm!r}") from None
        if sorted(perm) != list(range(len(self.dims))):
            raise ValueError(f"{perm} is not a permutation of the {len(self.dims)} dimensions of layout {self.key!r}")
        return Layout(self.index, self.sizes, tuple(self.dims[p] for p in perm))

    def fuse(self, i: int) -> "Layout":
        i = self._dim(i, "fuse")
        if i + 1 >= len(self.dims):
            raise ValueError(f"cannot fuse dimension {i} of layout {self.key!r}: it is the last one")
        return Layout(self.index, self.sizes, self.dims[:i] + (self.dims[i] + self.dims[i + 1],) + self.dims[i + 2 :])

    def pad(self, i: int, multiple: int) -> "Layout":
        i = self._dim(i, "pad")
        multiple = checks.integer(multiple, "pad multiple")
        why = self.why_not_pad(i, multiple)
        if why is not None:
            raise ValueError(why)
        atom = self.dims[i][0]
        extent = -(-atom.extent // multiple) * multiple
        padded = Atom(atom.var, atom.step, atom.count, extent, atom.outer)
        return Layout(self.index, self.sizes, self.dims[:i] + ((padded,),) + self.dims[i + 1 :])

    def why_not_pad(self, i: int, multiple: int) -> str | None:
        """Why :meth:`pad` refuses physical dimension ``i`` (in range), or None."""
        if len(self.dims[i]) != 1:
            return f"cannot pad dimension {i} of layout {self.key!r}: it is fused"
        if multiple < 2:
            return f"pad multiple must be >= 2, got {multiple}"
        atom = self.dims[i][0]
        if atom.extent % multiple == 0:
            return f"dimension {i} ({atom.key}) of layout {self.key!r} already has a multiple of {multiple} places"
        return None

    def outer_dim(self, var: str) -> int | None:
        """Index of the physical dimension holding ``var``'s outer atom alone, or None."""
        for i, dim in enumerate(self.dims):
            if len(dim) == 1 and dim[0].var == var and dim[0].outer:
                return i
        return None

    def pack(self, var: str, step: int) -> "Layout":
        """ALT's tiling template on one dimension: split ``var``'s outer piece so that its new
        inner piece covers ``step`` elements, move the new outer piece outermost and the new
        inner piece into the tile (the physical dimensions holding inner pieces, innermost):
        before the tile's pieces of ``var`` (larger steps outside), else at the tile's start.
        B[k, n] packed by 16 on n is B[n/16, k, 16]; B[n, k] is B[n/16, k, 16] too."""
        why = self.why_not_pack(var, step)
        if why is not None:
            raise ValueError(why)
        i = self.outer_dim(var)
        atom = self.dims[i][0]
        split = self.split(i, step // atom.step)
        outer, inner = split.dims[i], split.dims[i + 1]
        rest = [d for j, d in enumerate(split.dims) if j not in (i, i + 1)]
        untiled = [d for d in rest if all(a.outer for a in d)]
        tile = [d for d in rest if not all(a.outer for a in d)]
        same = [j for j, d in enumerate(tile) if any(a.var == var for a in d)]
        tile.insert(same[0] if same else 0, inner)
        return Layout(self.index, self.sizes, (outer, *untiled, *tile))

    def why_not_pack(self, var: str, step: int) -> str | None:
        """Why :meth:`pack` refuses ``var`` by ``step``, or None."""
        i = self.outer_dim(var)
        if i is None:
            return f"cannot pack {var!r} of layout {self.key!r}: its outer piece is fused"
        atom = self.dims[i][0]
        if step % atom.step or step // atom.step < 2:
            return f"cannot pack {var!r} of layout {self.key!r} by a step of {step}: not a multiple (>= 2x) of {atom.step}"
        return self.why_not_split(i, step // atom.step)

    def paired(self, var: str) -> "Layout | None":
        """This layout with the unit of ``var`` split off into a new innermost dimension of
        :data:`PAIR` (``...k1...`` becomes ``...k2....k1%2``): each two neighbouring indices of
        ``var`` side by side, the layout a bfloat16 kernel loads pairs of the reduction from
        (:mod:`looprl.backend.pairs`). None where that unit is a padded or odd-sized piece of a
        split, or ``var`` is paired already."""
        unit = next((a for a in self.atoms if a.var == var and a.step == 1), None)
        if unit is None or self.is_paired(var):
            return None
        if unit.outer:
            pairs = -(-self.sizes[self.index.index(var)] // PAIR)
            replaced = Atom(var, PAIR, pairs, pairs, True)
        elif unit.count % PAIR == 0 and unit.extent == unit.count:
            replaced = Atom(var, PAIR, unit.count // PAIR, unit.count // PAIR, False)
        else:
            return None
        dims = tuple(tuple(replaced if a is unit else a for a in dim) for dim in self.dims)
        return Layout(self.index, self.sizes, (*dims, (Atom(var, 1, PAIR, PAIR, False),)))

    def is_paired(self, var: str) -> bool:
        """Whether this layout stores ``var``'s indices two by two innermost (:meth:`paired`)."""
        return bool(self.dims) and self.dims[-1] == (Atom(var, 1, PAIR, PAIR, False),)

    def unpaired(self) -> "Layout":
        """This layout without the pairs :meth:`paired` made (itself where it has none): the
        inverse of :meth:`paired`."""
        last = self.dims[-1] if self.dims else ()
        if not (len(last) == 1 and self.is_paired(last[0].var)):
            return self
        var = last[0].var
        pair = next(a for dim in self.dims[:-1] for a in dim if a.var == var and a.step == PAIR)
        if pair.outer:
            size = self.sizes[self.index.index(var)]
            unit = Atom(var, 1, size, size, True)
        else:
            unit = Atom(var, 1, pair.count * PAIR, pair.count * PAIR, False)
        return Layout(self.index, self.sizes, tuple(tuple(unit if a is pair else a for a in dim) for dim in self.dims[:-1]))

    def block(self, sizes) -> "Layout":
        """This arrangement for a block of the tensor of ``sizes`` (each at most the tensor's):
        every piece but the outer one of each dimension as it is, the outer pieces counting
        the block's elements (their padding dropped). A staged block's buffer (``stage``:
        :mod:`looprl.ir.step`) holds a block's elements at block-local indices this way."""
        sizes = tuple(checks.integer(s, "block size") for s in sizes)
        if len(sizes) != len(self.sizes) or not all(1 <= s <= t for s, t in zip(sizes, self.sizes)):
            raise ValueError(f"block {sizes} is not a block of a tensor of {self.sizes}")
        size = dict(zip(self.index, sizes))

        def fitted(atom: Atom) -> Atom:
            if not atom.outer:
                return atom
            count = -(-size[atom.var] // atom.step)
            return Atom(atom.var, atom.step, count, count, True)

        return Layout(self.index, sizes, tuple(tuple(fitted(a) for a in dim) for dim in self.dims))

    def innermost(self, var: str) -> "Layout":
        """This row-major layout with ``var`` moved innermost, the other dimensions in order."""
        why = self.why_not_innermost(var)
        if why is not None:
            raise ValueError(why)
        order = self.index.replace(var, "") + var
        return Layout.from_key(self.index, self.sizes, ".".join(f"{v}1" for v in order))

    def why_not_innermost(self, var: str) -> str | None:
        """Why :meth:`innermost` refuses ``var``, or None."""
        if var not in self.index:
            return f"{var!r} is not a dimension of {self.index!r}"
        if not self.is_row_major:
            return f"only a row-major layout is re-ordered, not {self.key!r}"
        if self.index[-1] == var:
            return f"{var!r} is innermost in {self.index!r} already"
        return None
