"""A model of ``_mla_gluon_pairs``'s barrier protocol (session 24): the loader and the two consumer warpgroups as
Python generators over the kernel's mbarriers (try_wait parity, arrive, TMA expect + bytes), run under random
interleavings and load delays. Checks that nothing deadlocks, no barrier is arrived on past its phase, and every
shared-memory read sees the tile or P it expects. It mirrors the kernel by hand: change both together.

    python3 tools/mla_pairs_protocol.py      # both PV orders of warpgroup 1 (``OWN_PV_FIRST``), with and without
                                             # ``EARLY_SCORES``; tiles 0-11, full or partial last tile, 300
                                             # interleavings each
"""

from __future__ import annotations

import itertools
import random
import sys
from collections.abc import Iterator
from typing import Any

Op = tuple[Any, ...]


class Bar:
    """An mbarrier of arrival count 1: ``phase`` completed phases; ``tx``: a TMA's bytes still to land."""

    def __init__(self, name: str) -> None:
        self.name, self.pending, self.phase, self.tx = name, 0, 0, 0

    def arrive(self) -> None:
        self.pending += 1
        self.settle()

    def settle(self) -> None:
        if self.pending >= 1 and self.tx == 0:
            self.pending -= 1
            self.phase += 1

    def passes(self, parity: int) -> bool:
        """try_wait.parity: the phase of this parity has completed (a fresh barrier passes parity 1)."""
        return (self.phase & 1) != parity


class Model:
    """The kernel's barriers (ring slots 0 and 1) and what each shared-memory region holds."""

    def __init__(self, tiles: int, partial: bool, own_first: bool = False, early: bool = False) -> None:
        self.tiles, self.partial, self.own_first, self.early = tiles, partial, own_first, early
        self.ready = [[Bar(f"ready{c}.{sl}") for sl in range(2)] for c in range(5)]  # latent pieces 0-3, k_pe
        self.empty = [[Bar(f"empty{p}.{sl}") for sl in range(2)] for p in range(3)]  # left half, right half, k_pe
        self.m0, self.m1, self.pa, self.pb, self.tail = Bar("m0"), Bar("m1"), Bar("pa"), Bar("pb"), Bar("tail")
        self.mem: dict[str, Any] = {}
        self.inflight: list[tuple[Bar, list[tuple[str, Any]]]] = []

    def read(self, region: str, want: Any) -> None:
        got = self.mem.get(region)
        if got != want:
            raise AssertionError(f"read {region}: want {want}, found {got}")


def loader(m: Model) -> Iterator[Op]:
    """``_mla_gluon_ws._loader`` with ``KPE_LAST``: each part once tile t - 2 freed it; a partial last tile whole,
    on the private barrier, zeroed, then published."""
    for t in range(m.tiles):
        slot, freed = t % 2, ((t // 2) & 1) ^ 1
        if not (m.partial and t == m.tiles - 1):
            for h in range(2):
                yield ("wait", m.empty[h][slot], freed)
                for c in (2 * h, 2 * h + 1):
                    yield ("tma", m.ready[c][slot], [(f"ckv{c}.{slot}", ("kv", t))])
            yield ("wait", m.empty[2][slot], freed)
            yield ("tma", m.ready[4][slot], [(f"kpe.{slot}", ("kv", t))])
        else:
            for part in range(3):
                yield ("wait", m.empty[part][slot], freed)
            regions = [f"ckv{c}.{slot}" for c in range(4)] + [f"kpe.{slot}"]
            yield ("tma", m.tail, [(r, ("kv", t)) for r in regions])
            yield ("wait", m.tail, 0)
            for r in regions:  # the zeroing reads and rewrites the tile's rows
                yield ("read", r, ("kv", t))
            for c in range(5):
                yield ("arrive", m.ready[c][slot])


def scores(m: Model, t: int) -> Iterator[Op]:
    """``_tile_scores``: each piece's MMAs once it landed (operands read at issue and again at the wait)."""
    yield from score_pieces(m, t, 0, 5)
    yield ("mma_done", piece_regions(t, 0, 5))


def score_pieces(m: Model, t: int, first: int, last: int) -> Iterator[Op]:
    """``_score_pieces``: the MMAs of tile t's pieces [first, last) (4: k_pe) issued, each once it landed."""
    slot, phase = t % 2, (t // 2) & 1
    for c, (region, tag) in zip(range(first, last), piece_regions(t, first, last), strict=True):
        yield ("wait", m.ready[c][slot], phase)
        yield ("read", region, tag)


def piece_regions(t: int, first: int, last: int) -> list[tuple[str, Any]]:
    """The shared-memory regions of tile t's pieces [first, last) and the tile each must hold."""
    slot = t % 2
    return [(f"ckv{c}.{slot}" if c < 4 else f"kpe.{slot}", ("kv", t)) for c in range(first, last)]


def consumer(m: Model, wg: int) -> Iterator[Op]:
    """``_consume``: warpgroup 0 takes tile A = 2i of each step, warpgroup 1 tile B = 2i + 1."""
    if m.early and wg == 0 and m.tiles > 0:
        yield from scores(m, 0)
    for i in range((m.tiles + 1) // 2):
        ta, phase, has_b = 2 * i, i & 1, 2 * i + 1 < m.tiles
        if wg == 0:
            if not m.early:
                yield from scores(m, ta)
            yield ("write", "row_max0", ("m", i))
            yield ("arrive", m.m0)
            yield ("read", "ckv0.0", ("kv", ta))  # PV of A's left half, P from registers (synchronous)
            yield ("read", "ckv1.0", ("kv", ta))
            yield ("arrive", m.empty[0][0])
            yield ("wait", m.m1, phase)
            yield ("read", "row_max1", ("m", i))
            yield ("write", "kpe.0", ("P", ta))
            yield ("write", "row_sum0", ("s", i))
            yield ("arrive", m.pa)
            if has_b:
                yield ("wait", m.pb, phase)
                yield ("read", "row_sum1", ("s", i))
                pv = [("kpe.1", ("P", ta + 1)), ("ckv0.1", ("kv", ta + 1)), ("ckv1.1", ("kv", ta + 1))]
                for region, tag in pv:
                    yield ("read", region, tag)
                early = m.early and ta + 2 < m.tiles
                if early:  # the next A's left-half scores queued behind this PV
                    yield from score_pieces(m, ta + 2, 0, 2)
                yield ("mma_done", pv)
                yield ("arrive", m.empty[0][1])
                yield ("arrive", m.empty[2][1])
                if early:
                    yield from score_pieces(m, ta + 2, 2, 5)
                    yield ("mma_done", piece_regions(ta + 2, 0, 5))
        else:
            if has_b:
                yield from scores(m, ta + 1)
            yield ("write", "row_max1", ("m", i))
            yield ("arrive", m.m1)
            yield ("wait", m.m0, phase)
            yield ("read", "row_max0", ("m", i))
            if has_b:
                yield ("write", "kpe.1", ("P", ta + 1))
                yield ("write", "row_sum1", ("s", i))
                yield ("arrive", m.pb)
            if m.own_first and has_b:
                yield from _own_pv(m, ta + 1)
            yield ("wait", m.pa, phase)
            yield ("read", "row_sum0", ("s", i))
            pv = [("kpe.0", ("P", ta)), ("ckv2.0", ("kv", ta)), ("ckv3.0", ("kv", ta))]
            for region, tag in pv:
                yield ("read", region, tag)
            yield ("mma_done", pv)
            yield ("arrive", m.empty[1][0])
            yield ("arrive", m.empty[2][0])
            if not m.own_first and has_b:
                yield from _own_pv(m, ta + 1)


def _own_pv(m: Model, tb: int) -> Iterator[Op]:
    """``_own_pv``: warpgroup 1's PV of B's right half, P from registers (synchronous), then B's right half freed."""
    yield ("read", "ckv2.1", ("kv", tb))
    yield ("read", "ckv3.1", ("kv", tb))
    yield ("arrive", m.empty[1][1])


def run(tiles: int, partial: bool, seed: int, own_first: bool = False, early: bool = False) -> None:
    """One random interleaving; raises AssertionError on a deadlock, an overrun or a stale read."""
    rng = random.Random(seed)
    m = Model(tiles, partial, own_first, early)
    parts = {"loader": loader(m), "wg0": consumer(m, 0), "wg1": consumer(m, 1)}
    current: dict[str, Op | None] = dict.fromkeys(parts)
    done: set[str] = set()
    while len(done) < len(parts) or m.inflight:
        if m.inflight and rng.random() < 0.3:  # a TMA copy lands
            bar, writes = m.inflight.pop(rng.randrange(len(m.inflight)))
            for region, tag in writes:
                m.mem[region] = tag
            bar.tx = 0
            bar.settle()
            continue
        runnable = []
        for name, gen in parts.items():
            if name in done:
                continue
            if current[name] is None:
                try:
                    current[name] = next(gen)
                except StopIteration:
                    done.add(name)
                    continue
            op = current[name]
            if op is not None and (op[0] != "wait" or op[1].passes(op[2])):
                runnable.append(name)
        if not runnable:
            if m.inflight or len(done) == len(parts):
                continue
            stuck = [(n, op[1].name) for n, op in current.items() if n not in done and op is not None]
            raise AssertionError(f"deadlock: {stuck}")
        name = rng.choice(runnable)
        op, current[name] = current[name], None
        assert op is not None
        _step(m, op)


def _step(m: Model, op: Op) -> None:
    kind = op[0]
    if kind == "arrive":
        if op[1].pending:
            raise AssertionError(f"arrive on {op[1].name} past its phase")
        op[1].arrive()
    elif kind == "tma":
        bar = op[1]
        if bar.pending or bar.tx:
            raise AssertionError(f"expect on {bar.name} while its previous phase is open")
        bar.pending, bar.tx = 1, 1
        for region, tag in op[2]:
            m.mem[region] = ("landing", tag)  # the old contents go as the copy starts
        m.inflight.append((bar, op[2]))
    elif kind == "write":
        m.mem[op[1]] = op[2]
    elif kind == "read":
        m.read(op[1], op[2])
    elif kind == "mma_done":
        for region, tag in op[1]:
            m.read(region, tag)


def main() -> int:
    for own_first, early in itertools.product((False, True), (False, True)):
        for tiles in range(12):
            for partial in (False, True) if tiles else (False,):
                for seed in range(300):
                    try:
                        run(tiles, partial, seed, own_first, early)
                    except AssertionError as exc:
                        print(f"FAIL own_first={own_first} early={early} tiles={tiles} partial={partial} seed={seed}: "
                              f"{exc}")
                        return 1
    print("ok: both PV orders, with and without early scores, tiles 0-11, full or partial last tile, 300 interleavings "
          "each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
