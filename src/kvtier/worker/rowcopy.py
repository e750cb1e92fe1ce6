"""The compiled row copy loop: load the extension built at install time, call it per job.

Runs in the worker process, in the handler lane's thread (the CPU stand-in of the
GPU<->CPU copies, ``pagecopy.HostPageCopier``) and, on a GPU, in the threads that
submit to and poll a lane (``pagecopy.SlabRows``, the host side of scattered jobs).
numpy and torch have no primitive that copies a set of scattered rows to another set
of scattered rows in one pass: numpy's fancy indexing and torch's ``index_select`` /
``index_copy_`` gather into a temporary first, and one Python call per row costs as
much as copying an 8 KiB row. The C loop (``rowcopy.c``) does it in one pass: one
``memmove`` per row and fragment, one call per job. Whole handler jobs of 16 blocks
and more run at 1.0-2.8x the numpy copier's GB/s (``docs/worker.md``).

Building: ``rowcopy.c`` is compiled when kvtier is installed, as the file of the
extension module ``kvtier.worker._rowcopy`` (``pyproject.toml``; optional, so an
install without a C compiler succeeds without it). It is a plain C library, no
Python API (a C compiler and libc build it, no Python headers): the import system
finds its file by the module's name, ``ctypes`` opens it, nothing imports it.
Nothing is compiled at run time.

Falling back: with the extension not built, or one that reports another ABI or fails
its self-test (a library left from older source), ``native_row_copier()`` logs one
warning and returns ``None``; the caller then copies with numpy (the same bytes,
slower). ``KVTIER_NATIVE_COPY=0`` asks for the fallback outright.

Safety: every call checks every row against its side's row count before it copies
anything (a wrong index would write out of bounds): ``RowRoute.copy`` checks that the
row arrays are 1-D and of one length, and the C function checks each row (one
unsigned compare per row, in the same call, before any copy). A bad plan raises
``TransferSpecError`` and nothing is copied.

Per job, one call of three arguments: everything fixed about a route (fragment
tables, row counts, the addresses of its two row buffers) sits in one C struct built
once; the job's rows are copied into the route's buffers (no per-job address look-up:
numpy's ``.ctypes.data`` costs ~1.5 us).

Threads: the library is opened with ``ctypes.CDLL``, whose calls release the GIL
(``ctypes.PyDLL`` would hold it), so the store lane and the load lane copy at once.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import os
import threading
from collections.abc import Sequence

import numpy as np
import torch

from kvtier.errors import TransferSpecError
from kvtier.media.forks import renew_after_fork

logger = logging.getLogger(__name__)

EXTENSION = "kvtier.worker._rowcopy"
ABI = 5
"""What ``kvtier_rowcopy_abi()`` returns for the signatures this module calls; changed
with them, so that a library built from older source is refused."""
SWITCH_ENV = "KVTIER_NATIVE_COPY"
STREAM_MIN_BYTES = 2 << 20
"""Jobs of at least this many bytes write their destination with non-temporal stores
(it would not stay in the caches anyway). From cold caches streaming is equal at
512 KiB, equal or faster at 2 MiB and faster from 8 MiB; a 1 MiB job (16 KiB x 16)
copied with ``memmove`` took ~25% less time than streamed, hence 2 MiB, not 1."""

_I64P = ctypes.POINTER(ctypes.c_int64)
_UPTRP = ctypes.POINTER(ctypes.c_size_t)  # uintptr_t: pointer-sized, unsigned


class _Route(ctypes.Structure):
    """``struct kvtier_route`` of ``rowcopy.c``, field for field."""

    _fields_ = [
        ("n_frags", ctypes.c_int64),
        ("src_base", _UPTRP),
        ("src_stride", _I64P),
        ("dst_base", _UPTRP),
        ("dst_stride", _I64P),
        ("frag_bytes", _I64P),
        ("src_limit", ctypes.c_int64),
        ("dst_limit", ctypes.c_int64),
        ("src_rows", _I64P),
        ("dst_rows", _I64P),
    ]


class NativeRowCopier:
    """The loaded library (one per process, shared by every copier)."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.path = path
        fn = lib.kvtier_copy_rows
        fn.restype = ctypes.c_int64
        fn.argtypes = [ctypes.POINTER(_Route), ctypes.c_int64, ctypes.c_int32]
        self.copy_rows = fn

    def route(
        self,
        src: Sequence[torch.Tensor],
        dst: Sequence[torch.Tensor],
        names: tuple[str, str] = ("source", "destination"),
    ) -> RowRoute:
        """A route from ``src`` fragments to ``dst`` fragments (pairwise, same widths);
        ``names`` name the two sides in errors."""
        return RowRoute(self, src, dst, names)


class RowRoute:
    """Source and destination fragments, described once for one C call per job.

    Each fragment is a 2-D uint8 host tensor whose rows are contiguous; fragment ``f``
    of the source and of the destination have the same row width. Keeps the tensors
    alive as long as the route. One thread copies through a route at a time (a lock;
    a handler's lane is one thread anyway): the job's rows go through the route's own
    buffers. A forked child gets a new lock (``media/forks``).
    """

    def __init__(
        self,
        native: NativeRowCopier,
        src: Sequence[torch.Tensor],
        dst: Sequence[torch.Tensor],
        names: tuple[str, str] = ("source", "destination"),
    ) -> None:
        if len(src) != len(dst) or not src:
            raise ValueError(f"{len(src)} source and {len(dst)} destination fragments")
        for s, d in zip(src, dst, strict=True):
            _check_rows_view(s)
            _check_rows_view(d)
            if s.shape[1] != d.shape[1]:
                raise ValueError(f"fragment widths differ: {s.shape[1]} and {d.shape[1]}")
        self._tensors = (tuple(src), tuple(dst))
        self._fn = native.copy_rows
        self.src_rows = min(int(s.shape[0]) for s in src)
        self.dst_rows = min(int(d.shape[0]) for d in dst)
        n = len(src)
        self._tables = (
            (ctypes.c_size_t * n)(*(s.data_ptr() for s in src)),
            (ctypes.c_int64 * n)(*(_row_stride(s) for s in src)),
            (ctypes.c_size_t * n)(*(d.data_ptr() for d in dst)),
            (ctypes.c_int64 * n)(*(_row_stride(d) for d in dst)),
            (ctypes.c_int64 * n)(*(int(s.shape[1]) for s in src)),
        )
        self._route = _Route(n, *self._tables, self.src_rows, self.dst_rows)
        self._ref = ctypes.pointer(self._route)
        self._lock = threading.Lock()
        self._names = names
        self._row_bytes = sum(int(s.shape[1]) for s in src)
        self._grow(64)
        renew_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: a new lock (a parent's lane thread copying at the fork
        held the old one, for good in the child), and the row buffers made again (that
        thread may have been half-way through ``_grow``)."""
        self._lock = threading.Lock()
        self._grow(len(self._buffers[0]))

    def _grow(self, rows: int) -> None:
        """Row buffers for jobs of up to ``rows`` rows (the route's struct points at them)."""
        self._buffers = ((ctypes.c_int64 * rows)(), (ctypes.c_int64 * rows)())
        self._route.src_rows, self._route.dst_rows = self._buffers
        self._src, self._dst = (np.ctypeslib.as_array(b) for b in self._buffers)

    def copy(
        self,
        src_rows: np.ndarray,
        dst_rows: np.ndarray,
        stream: bool | None = None,
        *,
        through: tuple[int, torch.Tensor] | None = None,
    ) -> None:
        """Copy row ``src_rows[i]`` of every source fragment to row ``dst_rows[i]`` of
        the matching destination fragment, for every ``i``, in one call.

        ``stream``: write with non-temporal stores; by default when the job moves at
        least ``STREAM_MIN_BYTES``.

        ``through``: ``(side, tensor)``: for this call only, the source (``side`` 0) or
        destination (1), which must be one fragment, is ``tensor`` instead (same
        width; a job's own buffer: building a route per job costs ~30-40 us, this
        ~5). The route is back on its own fragment when the call returns or raises.

        Raises:
            TransferSpecError: the arrays differ in length, or a row is negative or
                past its side's rows (checked, in C, before anything is copied).
            ValueError: a ``through`` tensor a route would refuse, of another width,
                or for a side of several fragments.
        """
        src_rows, dst_rows = np.asarray(src_rows), np.asarray(dst_rows)
        if dst_rows.ndim != 1 or src_rows.ndim != 1 or len(dst_rows) != len(src_rows):
            raise TransferSpecError(f"row arrays differ: {src_rows.shape} and {dst_rows.shape}")
        counts = [self.src_rows, self.dst_rows]
        if through is not None:
            side, tensor = through
            own = self._tensors[side]
            if len(own) != 1:
                raise ValueError(f"through needs a side of one fragment, not {len(own)}")
            _check_rows_view(tensor)
            if tensor.shape[1] != own[0].shape[1]:
                raise ValueError(f"fragment widths differ: {tensor.shape[1]} and {own[0].shape[1]}")
            counts[side] = int(tensor.shape[0])
        n = len(src_rows)
        if n == 0:
            return
        if stream is None:
            stream = n * self._row_bytes >= STREAM_MIN_BYTES
        with self._lock:
            if n > len(self._src):
                self._grow(max(n, 2 * len(self._src)))
            self._src[:n] = src_rows  # as int64, as numpy casts (the C side checks them)
            self._dst[:n] = dst_rows
            if through is None:
                bad = self._fn(self._ref, n, stream)
            else:
                bad = self._call_through(through[0], through[1], n, stream)
        if bad >= 0:
            side, rows = (0, src_rows) if bad < n else (1, dst_rows)
            row = rows[bad % n]  # as given: a uint64 past int64 or a NaN is named as it is
            raise TransferSpecError(
                f"{self._names[side]} row {row} out of range 0..{counts[side] - 1}"
            )

    def _call_through(self, side: int, tensor: torch.Tensor, n: int, stream: bool) -> int:
        """The C call with ``side``'s one fragment swapped for ``tensor``; holds the lock."""
        base, stride = self._tables[2 * side], self._tables[2 * side + 1]
        limit = ("src_limit", "dst_limit")[side]
        saved = base[0], stride[0], getattr(self._route, limit)
        base[0], stride[0] = tensor.data_ptr(), _row_stride(tensor)
        setattr(self._route, limit, int(tensor.shape[0]))
        try:
            return int(self._fn(self._ref, n, stream))
        finally:
            base[0], stride[0] = saved[0], saved[1]
            setattr(self._route, limit, saved[2])


def check_rows(rows: np.ndarray, count: int, side: str) -> None:
    """Raise ``TransferSpecError`` unless every int64 in ``rows`` is in ``0..count-1``.

    One unsigned ``max`` (a negative row reads as a huge one).
    """
    if len(rows) and int(rows.view(np.uint64).max()) >= count:
        bad = int(rows[(rows < 0) | (rows >= count)][0])
        raise TransferSpecError(f"{side} row {bad} out of range 0..{count - 1}")


def _check_rows_view(view: torch.Tensor) -> None:
    if view.dtype != torch.uint8 or view.dim() != 2 or view.device.type != "cpu":
        raise ValueError("a route needs 2-D uint8 host tensors")
    if view.shape[1] > 1 and view.stride(1) != 1:
        raise ValueError("a route needs contiguous rows")


def _row_stride(view: torch.Tensor) -> int:
    return int(view.stride(0)) if view.shape[0] > 1 else int(view.shape[1])


def native_row_copier() -> NativeRowCopier | None:
    """The process's compiled copier, or ``None`` for the numpy fallback.

    ``None`` when ``KVTIER_NATIVE_COPY`` is ``0`` (asked for), or when the extension
    is not built or unusable (one warning per process, saying why).
    """
    if os.environ.get(SWITCH_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    return _load_once(EXTENSION)


@functools.cache
def _load_once(module: str) -> NativeRowCopier | None:
    return load_row_copier(module)


def load_row_copier(module: str = EXTENSION) -> NativeRowCopier | None:
    """Open the library of the extension ``module`` and self-test it.

    Never raises: on any failure logs a warning saying why and what the copies do
    instead, and returns ``None``.
    """
    copier, why = _open(module)
    if copier is None:
        logger.warning(
            "kvtier: the compiled row copier is unavailable (%s); host copies use numpy "
            "(the same bytes, slower for small pages)",
            why,
        )
    return copier


def _open(module: str) -> tuple[NativeRowCopier | None, str]:
    """``(copier, "")`` or ``(None, why)``."""
    try:
        spec = importlib.util.find_spec(module)
    except ImportError as exc:
        spec, why = None, f" ({exc})"
    else:
        why = ""
    path = spec.origin if spec is not None else None
    if path is None:
        return None, (
            f"{module} is not built{why}: kvtier was installed without a C compiler; "
            "reinstall it with one (e.g. gcc) to build it"
        )
    try:
        lib = ctypes.CDLL(path)
        abi = lib.kvtier_rowcopy_abi
        abi.restype, abi.argtypes = ctypes.c_int64, []
        if abi() != ABI:
            return None, f"{path} reports ABI {abi()} where {ABI} is expected: rebuild it"
        copier = NativeRowCopier(lib, path)
    except (OSError, AttributeError) as exc:
        return None, f"{path}: {exc}"
    if not _self_test(copier):
        return None, f"{path} copied the wrong bytes in its self-test: rebuild it"
    return copier, ""


def _self_test(copier: NativeRowCopier) -> bool:
    """Both store kinds; two fragments (3 and 200 bytes: unaligned heads and tails
    around the 64-byte loop), rows out of order, a strided destination."""
    gen = torch.Generator().manual_seed(0)
    src = [torch.randint(0, 256, (5, w), dtype=torch.uint8, generator=gen) for w in (3, 200)]
    rows_src, rows_dst = np.array([4, 0, 2], dtype=np.int64), np.array([1, 3, 0], dtype=np.int64)
    want = torch.zeros((4, 203), dtype=torch.uint8)
    for s, d in zip(rows_src.tolist(), rows_dst.tolist(), strict=True):
        want[d] = torch.cat([src[0][s], src[1][s]])
    for stream in (False, True):
        slab = torch.zeros((4, 203), dtype=torch.uint8)
        try:
            copier.route(src, [slab[:, :3], slab[:, 3:]]).copy(rows_src, rows_dst, stream)
        except TransferSpecError:  # a library that reports good rows bad
            return False
        if not torch.equal(slab, want):
            return False
    return True
