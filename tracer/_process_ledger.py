"""Each process's count of the records it holds, kept outside it, in a file mapped into memory.

A process can end without running a line of Python: killed (SIGKILL from a server's timeout, the
OOM killer), or ended from C. What it held in memory is then lost, and its own counts with it.
So every process that queues records keeps one small file in the run directory (``run_dir``:
``$RECALLTRACE_RUN_DIR``, else ``$XDG_RUNTIME_DIR/recalltrace``, else
``<temp dir>/recalltrace-<uid>``), mapped into its memory: the request path counts a record
there as it is queued (one store into shared memory), and the writer counts it out as it is
stored or dropped. The kernel keeps the file's content whatever happens to the process.

Invariant: for every process that queued a record, ``pending`` in its file equals the records it
holds (queued, or held by the writer), at any instant it could be stopped.

While a batch is being written the file also holds the batch's record ids: a process killed
in the middle of a write may have committed it or not, and whoever finds the file looks them up
in the database instead of guessing.

A process that ends through Python (``atexit``, ``os._exit``, a stopping signal) drains, says
its ledger, and removes its file. A file whose process is gone (its id free, or taken by a
process started later) was left by a process that ended otherwise: the next tracer process to
look (every writer looks when it starts and then every minute; ``recalltrace doctor`` too)
claims it (once its storage process, if it had one, has ended as well), looks up the records
of the batch it was writing, says in one line how many records that process lost, counts them
(``rag.traces.lost_by_ended_processes``), and appends what it found to ``ended.jsonl`` in the
same directory, which ``recalltrace doctor`` shows.
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

logger = logging.getLogger("recalltrace.tracer")

RUN_DIR_ENV = "RECALLTRACE_RUN_DIR"
_SUFFIX = ".ledger"
_MAGIC = 0x7274_6C65_6467_0001  # "rtledg", layout 1
_HEADER = 4096
_INFO_AT = 128
# int64 slots of the file's header, in order; the ids of the batch in write follow the header,
# 16 bytes each.
_MAGIC_SLOT, _PID, _START, _ACCEPTED, _PENDING, _IN_WRITE, _HELPER, _CAPACITY = range(8)
_SLOTS = 8
_ID_SIZE = 16
_ENDED_LOG = "ended.jsonl"
_ENDED_LOG_LIMIT = 1 << 20


def default_run_dir() -> Path:
    """Where the ledger files are kept when ``run_dir`` is not set."""
    configured = os.environ.get(RUN_DIR_ENV, "").strip()
    if configured:
        return Path(configured)
    runtime = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    if runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK):
        return Path(runtime) / "recalltrace"
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"recalltrace-{uid}"


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, Linux), None when it is gone or a
    zombie; 0 where the system does not say (the process exists)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except FileNotFoundError:
        return None
    except OSError:
        return _exists(pid)
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def _exists(pid: int) -> int | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return 0
    return 0


@dataclass(frozen=True)
class EndedProcess:
    """A process that ended without running its exit code while it held records."""

    pid: int
    pending: int
    """Records it held: queued, or in a write."""
    in_write: int
    """Of ``pending``, those in a write whose outcome it never learned."""
    accepted: int
    """Records it had queued in all."""
    service: str
    database: str
    started: str
    """When it started (UTC, ISO 8601)."""
    in_write_stored: int | None = None
    """Of ``in_write``, those found stored (the write committed before the end); ``None`` when
    they could not be looked up (another database, a sink that cannot say)."""
    found_at: str = ""
    found_by: int = 0
    in_write_ids: tuple[str, ...] = field(default=(), repr=False, compare=False)
    """The ids of the batch in write (not kept in ``ended.jsonl``)."""

    @property
    def lost(self) -> int:
        """Records it held that are not stored (those in write counted when not looked up)."""
        return self.pending - (self.in_write_stored or 0)

    def line(self) -> str:
        """The one line that says it."""
        never = self.pending - self.in_write
        if self.in_write_stored is None:
            write = (
                f"{self.in_write} were in a write it never saw confirmed (they could not be "
                "looked up: they may be stored)"
            )
        else:
            write = (
                f"{self.in_write - self.in_write_stored} were in a write that did not commit "
                f"(and {self.in_write_stored} more in that write were found stored)"
            )
        return (
            f"recalltrace: process {self.pid} ended holding {self.lost} record(s) it had "
            f"accepted and not stored (service {self.service or '?'}, database "
            f"{self.database or '?'}, started {self.started or '?'}): it was killed (SIGKILL, "
            "the OOM killer, a server's timeout) or ended without running Python's exit code; "
            f"{never} were never written, {write}"
        )


class ProcessLedger:
    """This process's file (see the module's documentation). Only its owner writes it."""

    def __init__(self, path: Path, memory: mmap.mmap) -> None:
        self.path = path
        self.pid = os.getpid()
        self._memory = memory
        self._slots = memoryview(memory).cast("B")[: _SLOTS * 8].cast("q")
        self._capacity = (len(memory) - _HEADER) // _ID_SIZE

    @classmethod
    def create(cls, directory: Path, info: dict[str, Any], batch_size: int) -> ProcessLedger:
        """Make this process's file in ``directory``, with room for the ids of a batch of
        ``batch_size``; ``OSError`` when it cannot be."""
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        global _made
        pid = os.getpid()
        ticks = start_ticks(pid) or time.time_ns()
        _made += 1
        path = directory / f"{pid}-{ticks}-{_made}{_SUFFIX}"
        size = _HEADER + _ID_SIZE * batch_size
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            memory = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        encoded = json.dumps(info, default=str).encode()[: _HEADER - _INFO_AT - 4]
        memory[_INFO_AT : _INFO_AT + 4] = struct.pack("=i", len(encoded))
        memory[_INFO_AT + 4 : _INFO_AT + 4 + len(encoded)] = encoded
        ledger = cls(path, memory)
        slots = ledger._slots
        slots[_PID] = pid
        slots[_START] = ticks
        slots[_CAPACITY] = ledger._capacity
        slots[_MAGIC_SLOT] = _MAGIC  # last: a file with the mark is complete
        return ledger

    def accepted(self, pending: int) -> None:
        """A record was queued; ``pending`` records are now held."""
        slots = self._slots
        slots[_ACCEPTED] += 1
        slots[_PENDING] = pending

    def set_pending(self, pending: int) -> None:
        """``pending`` records are now held (some were stored or dropped)."""
        self._slots[_PENDING] = pending

    def set_in_write(self, trace_ids: list[str]) -> None:
        """The records ``trace_ids`` (32 hex digits each) are in a write whose outcome is not
        known yet; ``[]`` when it is (ids past the room made for them are only counted)."""
        slots = self._slots
        if trace_ids:
            room = trace_ids[: self._capacity]
            self._memory[_HEADER : _HEADER + _ID_SIZE * len(room)] = bytes.fromhex("".join(room))
        slots[_IN_WRITE] = len(trace_ids)

    def set_helper(self, pid: int) -> None:
        """The pid of the storage process writing for this one (0: none)."""
        if self._slots[_HELPER] != pid:
            self._slots[_HELPER] = pid

    @property
    def pending(self) -> int:
        return int(self._slots[_PENDING])

    def close(self) -> None:
        """The process ended through Python and accounted for everything: remove the file."""
        with contextlib.suppress(OSError):
            self.path.unlink()
        self.release()

    def release(self) -> None:
        """Stop using the file without removing it (a copy in a forked child)."""
        with contextlib.suppress(Exception):
            self._slots.release()
        with contextlib.suppress(Exception):
            self._memory.close()


_made = 0
"""Files this process made (a process configured twice has one per writer)."""


def _read(path: Path) -> tuple[list[int], dict[str, Any], tuple[str, ...]] | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < _HEADER:
        return None
    slots = list(struct.unpack(f"={_SLOTS}q", data[: _SLOTS * 8]))
    if slots[_MAGIC_SLOT] != _MAGIC:
        return None
    (size,) = struct.unpack("=i", data[_INFO_AT : _INFO_AT + 4])
    try:
        info = json.loads(data[_INFO_AT + 4 : _INFO_AT + 4 + max(size, 0)] or b"{}")
    except ValueError:
        info = {}
    count = max(0, min(slots[_IN_WRITE], slots[_CAPACITY], (len(data) - _HEADER) // _ID_SIZE))
    ids = tuple(
        data[_HEADER + _ID_SIZE * i : _HEADER + _ID_SIZE * (i + 1)].hex() for i in range(count)
    )
    return slots, info if isinstance(info, dict) else {}, ids


def _files(directory: Path) -> Iterator[Path]:
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.endswith(_SUFFIX):
            yield directory / name


def _gone(path: Path) -> bool:
    """Whether the process that owns ``path`` (named ``<pid>-<start>-<n>.ledger``) has
    ended."""
    try:
        pid_text, start_text = path.name[: -len(_SUFFIX)].split("-")[:2]
        pid, start = int(pid_text), int(start_text)
    except ValueError:
        return False
    if pid == os.getpid():
        return False
    now = start_ticks(pid)
    if now is None:
        return True
    # Another process started since with the same id (0: the system does not say).
    return now != 0 and now != start


def _ended(slots: list[int], info: dict[str, Any], ids: tuple[str, ...]) -> EndedProcess:
    return EndedProcess(
        pid=slots[_PID],
        pending=max(slots[_PENDING], 0),
        in_write=min(max(slots[_IN_WRITE], 0), max(slots[_PENDING], 0)),
        accepted=slots[_ACCEPTED],
        service=str(info.get("service", "")),
        database=str(info.get("database", "")),
        started=str(info.get("started", "")),
        in_write_ids=ids,
    )


def _helper_alive(path: Path) -> bool:
    """Whether the storage process of the process that owns ``path`` still runs (it may still
    commit the batch in write: the file is left for a later look)."""
    read = _read(path)
    if read is None or read[0][_HELPER] <= 0:
        return False
    return start_ticks(int(read[0][_HELPER])) is not None


def claim_ended(directory: Path) -> list[EndedProcess]:
    """Claim the files of processes that ended without removing theirs; returns those that
    held records, for the caller to look up the batch in write and then :func:`record_ended`.
    A file is claimed by one process only (a rename); a file whose process held nothing is
    removed silently; one whose storage process still runs is left for a later look."""
    found: list[EndedProcess] = []
    me = os.getpid()
    for path in _files(directory):
        if not _gone(path) or _helper_alive(path):
            continue
        claimed = path.with_name(f"{path.name}.claimed-{me}")
        try:
            os.rename(path, claimed)
        except OSError:
            continue  # another process claimed it first
        read = _read(claimed)
        with contextlib.suppress(OSError):
            claimed.unlink()
        if read is None:
            continue
        ended = _ended(*read)
        if ended.pending > 0:
            found.append(ended)
    return found


def resolved(ended: EndedProcess, stored: set[str] | None) -> EndedProcess:
    """``ended`` with the records of its batch in write looked up: ``stored`` are the ids of
    that batch found in the database (``None``: they could not be looked up)."""
    if stored is None or not ended.in_write:
        return ended
    found = len(stored & set(ended.in_write_ids))
    if len(ended.in_write_ids) < ended.in_write:
        return ended  # not every id was kept: the rest cannot be looked up
    return replace(ended, in_write_stored=found)


def record_ended(directory: Path, ended: EndedProcess) -> EndedProcess:
    """Append what was found to ``ended.jsonl`` (for ``recalltrace doctor``); returns it with
    when and by whom it was found."""
    ended = replace(
        ended,
        found_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        found_by=os.getpid(),
    )
    _append_ended(directory, ended)
    return ended


def open_ledger(
    directory: Path | None, describe: Callable[[], dict[str, Any]], batch_size: int
) -> ProcessLedger | None:
    """This process's file in ``directory`` (``None``: no directory, or it cannot be made,
    which is said in one line)."""
    if directory is None:
        return None
    try:
        return ProcessLedger.create(directory, describe(), batch_size)
    except OSError as exc:
        logger.warning(
            "recalltrace: cannot keep this process's ledger file in %s (%s): if this process is "
            "killed, the records it holds cannot be counted by another (set RECALLTRACE_RUN_DIR "
            "to a writable directory)",
            directory,
            exc.strerror or exc,
        )
        return None


def look_for_ended(
    directory: Path, database: str | None, look_up: Callable[[list[str]], set[str] | None]
) -> list[EndedProcess]:
    """Claim the files of ended processes in ``directory``, look up the batch each was writing
    with ``look_up`` (when it wrote to ``database``, the one the caller writes to), record them
    in ``ended.jsonl``; returns them for the caller to say and count. Never raises."""
    try:
        found = claim_ended(directory)
    except Exception:
        logger.debug("looking for ended processes' ledger files failed", exc_info=True)
        return []
    said = []
    for ended in found:
        stored = None
        if ended.in_write_ids and ended.database == database:
            try:
                stored = look_up(list(ended.in_write_ids))
            except Exception:
                logger.debug("looking up an ended process's last batch failed", exc_info=True)
        said.append(record_ended(directory, resolved(ended, stored)))
    return said


def _append_ended(directory: Path, ended: EndedProcess) -> None:
    log = directory / _ENDED_LOG
    with contextlib.suppress(OSError):
        if log.stat().st_size > _ENDED_LOG_LIMIT:
            os.replace(log, directory / f"{_ENDED_LOG}.1")
    kept = asdict(ended)
    kept.pop("in_write_ids", None)
    line = (json.dumps(kept, sort_keys=True) + "\n").encode()
    try:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError:
        return
    try:
        os.write(fd, line)
    except OSError:
        pass
    finally:
        os.close(fd)


def ended_processes(directory: Path) -> list[EndedProcess]:
    """What ``ended.jsonl`` holds (oldest first), and the files of ended processes not claimed
    yet (read, not claimed)."""
    found: list[EndedProcess] = []
    for name in (f"{_ENDED_LOG}.1", _ENDED_LOG):
        try:
            lines = (directory / name).read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                found.append(EndedProcess(**json.loads(line)))
            except (ValueError, TypeError):
                continue
    for path in _files(directory):
        if _gone(path):
            read = _read(path)
            if read is not None and read[0][_PENDING] > 0:
                found.append(_ended(*read))
    return found


def live_processes(directory: Path) -> list[tuple[int, int, dict[str, Any]]]:
    """(pid, records held, info) of each running process that keeps a file here."""
    found = []
    for path in _files(directory):
        if _gone(path):
            continue
        read = _read(path)
        if read is not None:
            slots, info, _ = read
            found.append((slots[_PID], slots[_PENDING], info))
    return found
