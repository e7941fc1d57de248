"""The loader's position, saved with the model checkpoint, for an exact resume.

- :class:`LoaderState`: where the training loop stands in a run (the next batch it has not
  received, and the rest of a validation run it stopped inside), the fingerprint of the dataset
  the run goes through, which process of how many saved it, and a format version; JSON in and
  out. :meth:`hydrax.Dataloader.state` makes one; ``Dataloader(..., start_at=state)`` resumes
  from one and refuses one saved for another dataset (:class:`~hydrax.errors.CheckpointMismatchError`).
- :func:`write_state` and :func:`read_state`: one JSON file per process (``process_<i>-of-<n>.json``)
  in a directory, for a checkpoint of any kind; each file records the save it belongs to
  (:func:`save_id`), and a directory mixing the files of two saves is refused. Files are read
  within bounds (:data:`MAX_STATE_BYTES`, :data:`MAX_STATE_DEPTH`, see :func:`parse_json`).
- :class:`LoaderSave`, :class:`LoaderRestore` and :class:`LoaderCheckpointHandler`: the same
  files as an item of an Orbax checkpoint::

      manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(train_state),
                                                  loader=hydrax.checkpoint.LoaderSave(loader)))
      restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                               loader=hydrax.checkpoint.LoaderRestore()))
      loader = Dataloader(..., start_at=restored.loader)

  They are made (and registered with Orbax) on first use, so neither ``import hydrax`` nor
  ``import hydrax.checkpoint`` imports Orbax; without it installed, using them raises an
  ``ImportError`` that says ``pip install 'hydrax[orbax]'``.
- :func:`dataset_fingerprint` and :func:`dataset_summary`: what a state records of the dataset
  (see the "Checkpoints and exact resume" guide). How the Dataloader follows the loop's position
  is :class:`hydrax.order.position.LoopPosition`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import numbers
import os
import pathlib
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import CheckpointFormatError, CheckpointMismatchError
from .run.hosts import jax_process_split
from .order.schedule import Plan, plan_fingerprint

log = logging.getLogger(__name__)

#: The format of :class:`LoaderState` this hydrax writes, and the newest it reads.
FORMAT_VERSION = 1
#: What a state's JSON says it is (a check against reading some other JSON file as a state).
KIND = "hydrax.LoaderState"
#: The name of process ``i`` of ``n``'s state file in a checkpoint directory.
FILE_PATTERN = "process_{index}-of-{count}.json"
_FILE_RE = re.compile(r"process_(\d+)-of-(\d+)\.json$")
#: Sequences in a dataset summary longer than this are summarised as a count and a digest.
_LISTED = 8
#: The Plan's fields that say where a run starts and ends, or which share of it is loaded: not
#: the dataset.
_RUN_FIELDS = ("training", "validation", "start", "end", "stream")
_ORBAX_NAMES = ("LoaderSave", "LoaderRestore", "LoaderCheckpointHandler")
#: The largest state :func:`read_state` and :meth:`LoaderState.from_json` read, in bytes (in
#: characters, of a ``str``), and the deepest nesting of arrays and objects they parse. A state is a few kilobytes nested a few
#: levels deep (its dataset summary lists at most a few values of any sequence): anything far
#: past these is not a state, and parsing it could take the memory, or (nested 200,000 deep)
#: the interpreter's stack.
MAX_STATE_BYTES = 16 << 20
MAX_STATE_DEPTH = 64
#: A JSON string, escapes and all: what :func:`_json_depth` takes out of a text before it counts
#: brackets. An unterminated one runs to the end, so that the scan stays linear.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.S)
_ORBAX_HINT = "pip install 'hydrax[orbax]'"


@dataclasses.dataclass(frozen=True)
class LoaderState:
    """Where a Dataloader's training loop stands, for ``Dataloader(..., start_at=state)``.

    Made by :meth:`hydrax.Dataloader.state`; JSON-serialisable (:meth:`to_json`,
    :meth:`to_dict`). The position is that of the next batch the loop has *not* received:
    batches loaded ahead but not handed out are not part of it.

    :param epoch: with ``batch``, the next training batch (``start_at=(epoch, batch)``).
    :param batch: its place in the epoch, in ``[0, batches_per_epoch)``.
    :param fingerprint: the :attr:`~hydrax.Dataloader.dataset_fingerprint` of the run.
    :param validation_batch: None, or the loop stopped inside (or just before) the validation
        run that follows the training batch before ``(epoch, batch)``: the resumed run first
        delivers that run's batches from this one (its ``validation_epoch_batch``) on.
    :param process_index: the process that saved it (see ``Dataloader(process_index=...)``).
    :param process_count: of how many. A run may resume with another count: every process goes
        through the same global batches, and the batches do not depend on the count.
    :param dataset: a summary of what :attr:`fingerprint` digests (groups, sizes, seeds,
        shuffles, validation), so that a mismatch can say what differs.
    :param format: the format version (:data:`FORMAT_VERSION`).
    """

    epoch: int
    batch: int
    fingerprint: str
    validation_batch: int | None = None
    process_index: int = 0
    process_count: int = 1
    dataset: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)
    format: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        for name in ("epoch", "batch", "process_index", "process_count", "format"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name in ("process_count", "format") else 0):
                raise ValueError(f"a LoaderState's {name} must be a non-negative int, got {value!r}")
        if self.process_index >= self.process_count:
            raise ValueError(f"a LoaderState's process_index ({self.process_index}) must be below its process_count ({self.process_count})")
        pending = self.validation_batch
        if pending is not None and (isinstance(pending, bool) or not isinstance(pending, int) or pending < 0):
            raise ValueError(f"a LoaderState's validation_batch must be None or a non-negative int, got {pending!r}")
        if pending is not None and self.epoch == self.batch == 0:
            raise ValueError("a LoaderState at (0, 0) cannot have a validation run pending: none comes before the first batch")
        if not isinstance(self.fingerprint, str):
            raise ValueError(f"a LoaderState's fingerprint must be a str, got {self.fingerprint!r}")

    @property
    def start_at(self) -> tuple[int, int]:
        """``(epoch, batch)`` of the next training batch: ``start_at`` for a resume that knows the
        dataset changed (it skips a pending validation run, see :attr:`validation_batch`)."""
        return self.epoch, self.batch

    def to_dict(self) -> dict[str, Any]:
        """The state as a JSON-compatible dict (with ``"kind"``; :meth:`from_dict` reads it back)."""
        return {"kind": KIND, "format": self.format, "epoch": self.epoch, "batch": self.batch,
                "validation_batch": self.validation_batch, "fingerprint": self.fingerprint,
                "process_index": self.process_index, "process_count": self.process_count, "dataset": _plain(self.dataset)}

    def to_json(self) -> str:
        """The state as one line of JSON."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], path: str | None = None) -> LoaderState:
        """The state :meth:`to_dict` made; raises :class:`~hydrax.errors.CheckpointFormatError` for
        a newer format or something else (``path`` names the file in its words)."""
        where = f"{path}: " if path else ""
        if not isinstance(data, Mapping) or data.get("kind") != KIND:
            raise CheckpointFormatError(f"{where}this is not a hydrax loader state (no \"kind\": {KIND!r})",
                                        version=None, supported=FORMAT_VERSION, path=path)
        version = data.get("format")
        if isinstance(version, int) and version > FORMAT_VERSION:
            raise CheckpointFormatError(
                f"{where}this loader state has format {version}, newer than this hydrax reads ({FORMAT_VERSION}): it was "
                "saved by a newer hydrax; resume with that version (or pass start_at=(epoch, batch) from its "
                "\"epoch\" and \"batch\" to start there without its checks)", version=version, supported=FORMAT_VERSION, path=path)
        fields = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{key: value for key, value in data.items() if key in fields})
        except (TypeError, ValueError) as exc:
            raise CheckpointFormatError(f"{where}this loader state cannot be read: {exc}", version=version if isinstance(version, int) else None,
                                        supported=FORMAT_VERSION, path=path) from None

    @classmethod
    def from_json(cls, text: str | bytes, path: str | None = None) -> LoaderState:
        """The state :meth:`to_json` wrote; :class:`~hydrax.errors.CheckpointFormatError` for
        anything else, including text beyond :data:`MAX_STATE_BYTES` or nested deeper than
        :data:`MAX_STATE_DEPTH`."""
        return cls.from_dict(parse_json(text, path), path)

    def __str__(self) -> str:
        pending = "" if self.validation_batch is None else f", validation batch {self.validation_batch} of the run before it first"
        return (f"epoch {self.epoch}, batch {self.batch}{pending} (dataset {self.fingerprint}, process {self.process_index} "
                f"of {self.process_count})")


def parse_json(text: str | bytes, path: str | None = None) -> Any:
    """``text`` parsed as JSON, within bounds: a text beyond :data:`MAX_STATE_BYTES`, nested
    deeper than :data:`MAX_STATE_DEPTH`, or not JSON raises
    :class:`~hydrax.errors.CheckpointFormatError` naming ``path``, before the parser sees it."""
    where = f"{path}: " if path else ""

    def refuse(why: str) -> CheckpointFormatError:
        return CheckpointFormatError(f"{where}this is not a hydrax loader state ({why})", version=None,
                                     supported=FORMAT_VERSION, path=path)

    if len(text) > MAX_STATE_BYTES:
        raise refuse(f"it is larger than {MAX_STATE_BYTES} bytes; a state is a few kilobytes")
    try:
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode(json.detect_encoding(text), "surrogatepass")
    except (UnicodeDecodeError, LookupError) as exc:
        raise refuse(f"not text: {exc}") from None
    if _json_depth(text) > MAX_STATE_DEPTH:
        raise refuse(f"nested more than {MAX_STATE_DEPTH} deep; a state is nested a few levels")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise refuse(f"not JSON: {exc}") from None


def _json_depth(text: str) -> int:
    """How deep arrays and objects nest in JSON ``text`` (brackets inside strings aside), found
    without parsing: the parser recurses once per level."""
    codes = np.frombuffer(_JSON_STRING.sub("", text).encode("utf-8", "surrogatepass"), np.uint8)
    if not codes.size:
        return 0
    steps = ((codes == ord("[")) | (codes == ord("{"))).view(np.int8) - ((codes == ord("]")) | (codes == ord("}"))).view(np.int8)
    steps = steps[steps != 0]  # only the brackets: a hostile 16 MiB text costs a running sum of int32, not int64 per byte
    return int(np.cumsum(steps, dtype=np.int32).max()) if steps.size else 0


def as_state(source: Any) -> LoaderState:
    """A :class:`LoaderState` from a Dataloader (its :meth:`~hydrax.Dataloader.state`), a state,
    or a state's :meth:`~LoaderState.to_dict` form."""
    if isinstance(source, LoaderState):
        return source
    if isinstance(source, Mapping):
        return LoaderState.from_dict(source)
    state = getattr(source, "state", None)
    if callable(state):
        return as_state(state())
    raise TypeError(f"expected a hydrax.Dataloader or a hydrax.checkpoint.LoaderState, got {type(source).__name__}")


# -- the dataset --------------------------------------------------------------------------------


def _whole(plan: Plan) -> Plan:
    """``plan`` as every process of any count, at any start, has it: whole batches, no start,
    end or stream."""
    return dataclasses.replace(
        plan, training=tuple(dataclasses.replace(g, share=()) for g in plan.training),
        validation=tuple(dataclasses.replace(g, share=()) for g in plan.validation), start=(0, 0), end=None, stream=None)


def dataset_fingerprint(plan: Plan) -> str:
    """A short digest of everything in ``plan`` that decides which batches a run has and what
    they hold (groups, sizes, seeds, shuffle modes, validation), and of nothing that says where
    the run starts or ends, or which process or stream share loads it: a resumed run has the
    fingerprint of the run it resumes, with any number of processes."""
    return plan_fingerprint(_whole(plan))


def dataset_summary(plan: Plan) -> dict[str, Any]:
    """What :func:`dataset_fingerprint` digests, in JSON: one dict per group (its plan's fields but
    the share; long sequences as a count and a digest) and the run's other fields."""
    whole = _whole(plan)
    summary: dict[str, Any] = {}
    for f in dataclasses.fields(whole):
        if f.name not in _RUN_FIELDS:
            summary[f.name] = _plain(getattr(whole, f.name))
    summary["batches_per_epoch"] = whole.batches_per_epoch
    for kind in ("training", "validation"):
        summary[kind] = [{f.name: _plain(getattr(g, f.name)) for f in dataclasses.fields(g) if f.name != "share"}
                         for g in getattr(whole, kind)]
    return summary


def _plain(value: Any) -> Any:
    """``value`` as JSON-compatible data: numbers, strings, lists, dicts; a long sequence as its
    count and a digest; anything else as its repr."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        if len(value) <= _LISTED:
            return [_plain(v) for v in value]
        return {"count": len(value), "digest": hashlib.sha256(repr(value).encode()).hexdigest()[:16]}
    return repr(value)


def dataset_differences(saved: Mapping[str, Any], here: Mapping[str, Any], where: str = "") -> list[str]:
    """What differs between two :func:`dataset_summary` results, one phrase each."""
    found = []
    for key in [*saved, *(k for k in here if k not in saved)]:
        before, now = saved.get(key), here.get(key)
        if before == now:
            continue
        if key in ("training", "validation") and isinstance(before, list) and isinstance(now, list):
            if len(before) != len(now):
                found.append(f"{len(before)} {key} groups in the checkpoint, {len(now)} here")
                continue
            for i, (a, b) in enumerate(zip(before, now)):
                if isinstance(a, Mapping) and isinstance(b, Mapping):
                    found += dataset_differences(a, b, f"{key} group {i}: ")
        elif key == "batches_per_epoch" and where == "":
            continue  # follows from the groups, whose difference is said
        else:
            found.append(f"{where}{key} is {_words(before)} in the checkpoint, {_words(now)} here")
    return found


def _words(value: Any) -> str:
    if isinstance(value, Mapping) and set(value) == {"count", "digest"}:
        return f"{value['count']} values (digest {value['digest']})"
    return repr(value)


def check_resume(state: LoaderState, plan: Plan, process_index: int, process_count: int) -> None:
    """Refuse ``state`` for a run over another dataset than ``plan``'s, with
    :class:`~hydrax.errors.CheckpointMismatchError` saying what differs (and one made by hand with
    a newer ``format``, with :class:`~hydrax.errors.CheckpointFormatError`)."""
    if state.format > FORMAT_VERSION:
        LoaderState.from_dict(state.to_dict())  # raises, in the words of a state read from a file
    actual = dataset_fingerprint(plan)
    if state.fingerprint != actual:
        differences = tuple(dataset_differences(state.dataset, dataset_summary(plan))) if state.dataset else ()
        said = "; ".join(differences) if differences else "the checkpoint does not say what (it has no summary of its dataset)"
        raise CheckpointMismatchError(
            f"start_at is a loader state saved for another dataset (fingerprint {state.fingerprint}; this Dataloader's is "
            f"{actual}): {said}. Resuming would not give the batches the interrupted run would have had. Build the "
            "Dataloader with the training and validation groups (items, batch sizes, seeds, shuffle modes) and the "
            "validation setting of the run that saved it; to start at its position anyway, knowing that the batches "
            f"differ, pass start_at={state.start_at}",
            expected=state.fingerprint, actual=actual, differences=differences)
    bpe = plan.batches_per_epoch
    if state.batch >= bpe:
        # Dataloader.state() gives a batch within its epoch: another one was made by hand, and
        # resuming would quietly count on into a later epoch
        raise CheckpointFormatError(
            f"start_at is a loader state at batch {state.batch} of epoch {state.epoch}, but this Dataloader's epochs "
            f"have {bpe} batches (0 to {bpe - 1}): the state was changed by hand or damaged. Resume from a state "
            f"Dataloader.state() gave; to start there anyway, counting on into the following epochs, pass "
            f"start_at={state.start_at}", version=state.format, supported=FORMAT_VERSION, path=None)
    if state.validation_batch is not None and state.validation_batch >= plan.batches_per_validation:
        raise CheckpointMismatchError(
            f"start_at is a loader state inside a validation run, at its batch {state.validation_batch}, but this "
            f"Dataloader's validation runs have {plan.batches_per_validation} batches: the state was changed by hand",
            expected=state.fingerprint, actual=actual, differences=("validation_batch",))
    if state.process_count != process_count:
        log.info("[hydrax] resuming at %s, saved by %d processes, with %d: every process goes through the same "
                 "global batches, so the position holds", state, state.process_count, process_count)


def schedule_start(state: LoaderState) -> tuple[tuple[int, int], int]:
    """Where the schedule of a run resumed at ``state`` starts, and how many of its first batches
    (training and validation, in schedule order) the run skips.

    A validation run belongs to the training batch before it, and a run that starts after that
    batch never runs it (see :func:`hydrax.order.schedule.iter_steps`). So a state with a validation
    run pending starts one training batch earlier, and skips that batch and the validation
    batches the loop has had."""
    if state.validation_batch is None:
        return (state.epoch, state.batch), 0
    return (state.epoch, state.batch - 1), 1 + state.validation_batch


# -- files --------------------------------------------------------------------------------------


def state_file(process_index: int, process_count: int) -> str:
    """The name of a process's state file in a checkpoint directory."""
    return FILE_PATTERN.format(index=process_index, count=process_count)


def _path(directory: Any) -> Any:
    # Orbax hands over an etils.epath.Path (local or remote); anything else is a local path.
    return directory if hasattr(directory, "read_text") and hasattr(directory, "glob") else pathlib.Path(directory)


def save_id(state: LoaderState) -> str:
    """The id :func:`write_state` records of a save by default: a digest of the position
    (``epoch``, ``batch``, ``validation_batch``) and the dataset fingerprint. Every process of
    one save stands at the same position, so each computes the same id alone, with nothing to
    exchange; two saves with the same id resume at the same place, so files of both agree.
    A file written without an id (by an older hydrax) is read as having this one."""
    key = json.dumps([state.fingerprint, state.epoch, state.batch, state.validation_batch])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def write_state(directory: Any, source: Any, *, atomic: bool = True, save: str | int | None = None) -> Any:
    """Write a loader state (``source``: a Dataloader, a :class:`LoaderState`) into ``directory``
    as ``process_<i>-of-<n>.json`` of the process that made it; returns the file's path.

    Every process of a run writes its own file (they may share the directory). With ``atomic``
    (the default) the file is written under a temporary name and renamed, so a process killed
    while writing leaves the previous file whole; the Orbax handler writes directly, as Orbax
    makes the whole checkpoint appear at once.

    The file records which save it belongs to (``"save"``): ``save`` if given (the training
    step, say: the same for every process of this save), else :func:`save_id` of the state.
    :func:`read_state` refuses a directory whose files belong to different saves.
    """
    state = as_state(source)
    if save is None:
        save = save_id(state)
    elif isinstance(save, bool) or not isinstance(save, (str, int)):
        raise TypeError(f"save must be a str or an int naming this save (the training step, say), got {type(save).__name__}")
    directory = _path(directory)
    name = state_file(state.process_index, state.process_count)
    path = directory / name
    text = json.dumps({**state.to_dict(), "save": str(save)}, sort_keys=True)
    if not atomic:
        path.write_text(text)
        return path
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".{name}.{os.getpid()}.tmp"
    temporary.write_text(text)
    temporary.replace(path)
    return path


def read_state(directory: Any, process_index: int | None = None, process_count: int | None = None) -> LoaderState:
    """The loader state of this process in ``directory`` (see :func:`write_state`).

    ``process_index`` and ``process_count`` default to JAX's (one process without
    ``jax.distributed``). When the checkpoint was saved by another number of processes, this
    reads process 0's state: every process of a run hands out the same global batches in the
    same order, so all of them stand at the same position. Raises ``FileNotFoundError`` when the
    directory holds no state.

    The files must belong to one save: this process's file is compared with the first file of
    each process count in the directory (two or three reads, however many processes), and a
    directory holding files of different saves (the rest of an earlier save by another number
    of processes, or a save that stopped halfway over an earlier one) raises
    :class:`~hydrax.errors.CheckpointFormatError` naming both files: which one is current,
    only the user knows."""
    if (process_index is None) != (process_count is None):
        raise ValueError("process_index and process_count go together: pass both, or neither to take them from JAX")
    if process_index is None or process_count is None:
        process_index, process_count = jax_process_split()
    directory = _path(directory)
    saved = {}  # (index, count) -> path, of every state file in the directory
    for p in directory.glob("process_*-of-*.json"):
        match = _FILE_RE.search(str(p))
        if match:
            saved[tuple(int(n) for n in match.groups())] = p
    if not saved:
        raise FileNotFoundError(f"no hydrax loader state in {directory} (files named process_<i>-of-<n>.json)")
    mine = (process_index, process_count)
    if mine not in saved:
        mine = min(saved)
        log.info("[hydrax] the loader state in %s was saved by %d processes; process %d of %d resumes at process %d's "
                 "position, which is every process's", directory, mine[1], process_index, process_count, mine[0])
    state, save = _read_file(saved[mine])
    firsts: dict[int, tuple[int, int]] = {}
    for key in sorted(saved):
        firsts.setdefault(key[1], key)
    for key in firsts.values():
        if key == mine:
            continue
        other, other_save = _read_file(saved[key])
        if other_save != save:
            raise CheckpointFormatError(
                f"{directory} holds loader states of different saves: {saved[mine].name} ({_position(state)}, save "
                f"{save}) and {saved[key].name} ({_position(other)}, save {other_save}). Which is current cannot be "
                "told from the files: delete the files of the save not to resume from (or keep each checkpoint in a "
                "directory of its own), then read again", version=state.format, supported=FORMAT_VERSION, path=str(directory))
    return state


def _read_file(path: Any) -> tuple[LoaderState, str]:
    """The state in a state file and the save it belongs to (see :func:`write_state`), reading
    no more than :data:`MAX_STATE_BYTES` of it."""
    name = str(path)
    with path.open("rb") as f:
        data = parse_json(f.read(MAX_STATE_BYTES + 1), name)
    state = LoaderState.from_dict(data, name)
    save = data.get("save")
    if save is None:
        return state, save_id(state)
    if not isinstance(save, str):
        raise CheckpointFormatError(f"{name}: this loader state's \"save\" must be a str, got {save!r}", version=state.format,
                                    supported=FORMAT_VERSION, path=name)
    return state, save


def _position(state: LoaderState) -> str:
    pending = "" if state.validation_batch is None else f", validation batch {state.validation_batch}"
    return f"epoch {state.epoch}, batch {state.batch}{pending}"


# -- Orbax ---------------------------------------------------------------------------------------


def __getattr__(name: str) -> Any:
    # The Orbax classes are made on first use: importing hydrax.checkpoint must not import Orbax.
    if name in _ORBAX_NAMES:
        return _orbax_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _orbax_classes() -> dict[str, type]:
    try:
        import orbax.checkpoint as ocp
    except ImportError as exc:
        raise ImportError(f"hydrax.checkpoint's Orbax support ({', '.join(_ORBAX_NAMES)}) needs orbax-checkpoint: "
                          f"{_ORBAX_HINT}") from exc
    return _define_orbax(ocp)


def _define_orbax(ocp: Any) -> dict[str, type]:
    """The handler and its arguments, registered with Orbax so that ``ocp.args.Composite`` finds
    the handler from the arguments' type."""

    class LoaderCheckpointHandler(ocp.CheckpointHandler):
        """Saves and restores a Dataloader's :class:`LoaderState` as an item of an Orbax
        checkpoint: each process writes and reads its own ``process_<i>-of-<n>.json`` in the
        item's directory (see :func:`write_state` and :func:`read_state`)."""

        def save(self, directory: Any, args: Any = None) -> None:
            write_state(directory, args.state, atomic=False)

        def restore(self, directory: Any, args: Any = None) -> LoaderState:
            args = args if args is not None else LoaderRestore()
            return read_state(directory, args.process_index, args.process_count)

    @dataclasses.dataclass
    class LoaderSave(ocp.args.CheckpointArgs):
        """Orbax save arguments: the position of ``item`` (a Dataloader, taken now, or a
        :class:`LoaderState`), for ``ocp.args.Composite(..., loader=LoaderSave(loader))``."""

        item: Any
        state: LoaderState = dataclasses.field(init=False)

        def __post_init__(self) -> None:
            self.state = as_state(self.item)

    @dataclasses.dataclass
    class LoaderRestore(ocp.args.CheckpointArgs):
        """Orbax restore arguments: the restored item is this process's :class:`LoaderState`,
        for ``Dataloader(..., start_at=...)``. ``process_index`` and ``process_count`` default
        to JAX's."""

        process_index: int | None = None
        process_count: int | None = None

    classes = {"LoaderCheckpointHandler": LoaderCheckpointHandler, "LoaderSave": LoaderSave, "LoaderRestore": LoaderRestore}
    for name, cls in classes.items():
        # Orbax records a handler by module and name: this module's, not this function's
        cls.__module__, cls.__qualname__ = __name__, name
    ocp.args.register_with_handler(LoaderCheckpointHandler, for_save=True)(LoaderSave)
    ocp.args.register_with_handler(LoaderCheckpointHandler, for_restore=True)(LoaderRestore)
    return classes


# The Orbax classes are left out: ``from hydrax.checkpoint import *`` must work without Orbax.
__all__ = ["FORMAT_VERSION", "MAX_STATE_BYTES", "MAX_STATE_DEPTH", "CheckpointFormatError", "CheckpointMismatchError", "LoaderState",
           "as_state", "dataset_fingerprint", "dataset_summary", "parse_json", "read_state", "save_id", "write_state"]
