"""LoRA adapter versions: stored as peft adapters, served on top of their base's loaded weights.

A version trained with LoRA is saved as the adapter alone (``adapter_config.json`` +
``adapter_model.safetensors`` + tokenizer) with a reference to its base version (the parent
it was trained from; ``version.json`` lineage ``adapter.base``, and peft's own
``base_model_name_or_path``). Such a version costs its adapter on disk and, when served, in
memory: :class:`SharedWeights` holds one base model's weights once, and every adapter
version on it is injected into those same modules (peft LoRA layers next to the frozen
weights, nothing copied).

Which adapter a forward pass uses is chosen per call, never by switching global state: the
LoRA layers get peft's per-sample ``adapter_names`` argument (its "mixed batch" inference)
from a forward pre-hook that reads the calling thread's selection (:func:`adapter_scope`).
peft's own ``generate(adapter_names=...)`` registers such hooks on the shared modules for the
duration of one call, which other threads would see; these hooks are installed once and read
a thread-local value, so the control and variants answer concurrently from one set of
weights. The active adapter set of the layers stays empty, so code that calls the base model
without a selection gets the base model. Attaching a new adapter changes the modules, so it
waits for running forward passes and blocks new ones meanwhile (a readers-writer lock that
every :class:`ModelView` call takes).
"""
from __future__ import annotations

import functools
import json
import re
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
BASE = "__base__"  # peft's name for "no adapter" in adapter_names


# ---------------------------------------------------------------------------- adapter directories

def is_adapter(path: str | Path) -> bool:
    """A directory holding a peft adapter (and no full model of its own)."""
    p = Path(str(path))
    return (p / ADAPTER_CONFIG).is_file() and not (p / "config.json").is_file()


def adapter_config(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(str(path)) / ADAPTER_CONFIG).read_text())


def base_of(path: str | Path) -> Path:
    """The base model directory of an adapter version: the version named by its lineage
    (``version.json`` ``adapter.base``) next to it in the store, else peft's
    ``base_model_name_or_path`` (the directory it was trained on)."""
    p = Path(str(path))
    meta_file = p / "version.json"
    if meta_file.is_file():
        try:
            base = (json.loads(meta_file.read_text()).get("adapter") or {}).get("base")
        except ValueError:
            base = None
        if base and (p.parent / base).is_dir():
            return p.parent / base
    return Path(adapter_config(p)["base_model_name_or_path"])


def adapter_lineage(path: str | Path) -> dict[str, Any] | None:
    """``version.json``'s ``adapter`` entry for a directory holding an adapter, else None."""
    p = Path(str(path))
    if not is_adapter(p):
        return None
    base = Path(str(adapter_config(p).get("base_model_name_or_path") or ""))
    return {"base": base.name, "base_path": str(base)}


def adapter_bytes(path: str | Path) -> int:
    """Size of the adapter's weight file."""
    return sum((Path(str(path)) / f).stat().st_size for f in ADAPTER_WEIGHTS if (Path(str(path)) / f).is_file())


def merged_model(base_model: Any, path: str | Path) -> Any:
    """``base_model`` with the adapter at ``path`` merged into its weights (a plain model; the
    base object is changed in place). For training and evaluation, which want plain models."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base_model, str(path), is_trainable=False).merge_and_unload()


# ---------------------------------------------------------------------------- per-thread selection

_selection = threading.local()


@contextmanager
def adapter_scope(names: str | list[str] | None) -> Iterator[None]:
    """Within the block, forward passes of this thread on shared weights use adapter ``names``:
    one name for every row, or one per row (:data:`BASE` for the base model); None: the base."""
    previous = getattr(_selection, "names", None)
    _selection.names = names
    try:
        yield
    finally:
        _selection.names = previous


def _select_adapter(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    names = getattr(_selection, "names", None)
    if names is None or names == BASE:
        return None  # no argument: the layer runs its active adapters, which are none
    if isinstance(names, str):
        x = args[0] if args else kwargs["x"]
        names = [names] * len(x)
    kwargs["adapter_names"] = names
    return args, kwargs


# ---------------------------------------------------------------------------- the lock

class _ReadersWriterLock:
    """Many readers (forward passes) or one writer (attaching an adapter). A waiting writer
    keeps new readers out; a thread that already reads may read again (nested calls)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0
        self._mine = threading.local()

    @contextmanager
    def read(self) -> Iterator[None]:
        depth = getattr(self._mine, "depth", 0)
        if depth == 0:
            with self._cond:
                while self._writing or self._writers_waiting:
                    self._cond.wait()
                self._readers += 1
        self._mine.depth = depth + 1
        try:
            yield
        finally:
            self._mine.depth = depth
            if depth == 0:
                with self._cond:
                    self._readers -= 1
                    if not self._readers:
                        self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            while self._writing or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


# ---------------------------------------------------------------------------- shared weights

class SharedWeights:
    """One loaded model whose weights serve its own version and any LoRA versions on top."""

    def __init__(self, model: Any) -> None:
        self.model = model  # the plain transformers model; LoRA layers are injected into it
        self.lock = _ReadersWriterLock()
        self.adapters: dict[str, str] = {}  # adapter name -> directory
        self._peft: Any = None  # the PeftModel that injected the adapters (shares self.model's modules)
        self._hooked: set[int] = set()

    def view(self, adapter: str | None = None) -> "ModelView":
        return ModelView(self, adapter)

    def attach(self, path: str | Path, name: str | None = None) -> "ModelView":
        """Inject the LoRA adapter at ``path`` (once) and return a view that answers with it."""
        path = str(path)
        for existing, where in self.adapters.items():
            if where == path:
                return ModelView(self, existing)
        cfg = adapter_config(path)
        if str(cfg.get("peft_type", "")).upper() != "LORA" or cfg.get("use_dora"):
            raise ValueError(f"{path}: only plain LoRA adapters can share their base's weights "
                             f"(peft_type {cfg.get('peft_type')!r}, use_dora {cfg.get('use_dora')!r})")
        with self.lock.write():
            adapter = self._unique_name(name or Path(path).name)
            if self._peft is None:
                from peft import PeftModel

                # low_cpu_mem_usage: the adapter's tensors are the loaded ones (no initialised copy)
                self._peft = PeftModel.from_pretrained(self.model, path, adapter_name=adapter, is_trainable=False,
                                                       low_cpu_mem_usage=True)
            else:
                self._peft.load_adapter(path, adapter_name=adapter, is_trainable=False, low_cpu_mem_usage=True)
            self._after_change()
            self.adapters[adapter] = path
        return ModelView(self, adapter)

    def _unique_name(self, wanted: str) -> str:
        base = re.sub(r"\W", "_", wanted) or "adapter"
        name, n = base, 1
        while name in self.adapters or name == BASE:
            n += 1
            name = f"{base}_{n}"
        return name

    def _after_change(self) -> None:
        """Every adapter layer: no active adapter (a call without a selection is the base model),
        eval mode, and the per-thread selection hook (installed once per layer)."""
        from peft.tuners.tuners_utils import BaseTunerLayer

        try:
            from peft.utils.other import ModulesToSaveWrapper
        except ImportError:  # pragma: no cover - older peft
            ModulesToSaveWrapper = ()  # noqa: N806
        for module in self.model.modules():
            if isinstance(module, BaseTunerLayer):
                module.set_adapter([])
            if isinstance(module, (BaseTunerLayer, ModulesToSaveWrapper)) and id(module) not in self._hooked:
                module.register_forward_pre_hook(_select_adapter, with_kwargs=True)
                self._hooked.add(id(module))
        self.model.eval()


class ModelView:
    """What a served version's ``LoadedModel.model`` is: the shared model, called under the
    shared weights' read lock with this version's adapter selected (None: the base itself).
    Everything else (``config``, ``generation_config``, ``device`` ...) is the shared model's."""

    def __init__(self, shared: SharedWeights, adapter: str | None = None) -> None:
        self.shared = shared
        self.adapter = adapter

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.shared.lock.read(), adapter_scope(self.adapter):
            return self.shared.model(*args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        with self.shared.lock.read(), adapter_scope(self.adapter):
            return self.shared.model.generate(*args, **kwargs)

    @property
    def forward(self) -> Any:
        raw = self.shared.model.forward

        @functools.wraps(raw)  # keeps the signature (callers inspect it)
        def forward(*args: Any, **kwargs: Any) -> Any:
            with self.shared.lock.read(), adapter_scope(self.adapter):
                return raw(*args, **kwargs)
        return forward

    def __getattr__(self, name: str) -> Any:
        if name in ("shared", "adapter"):  # not set yet (copy/pickle): no recursion
            raise AttributeError(name)
        return getattr(self.shared.model, name)

    def __repr__(self) -> str:
        return f"ModelView(adapter={self.adapter!r}, model={type(self.shared.model).__name__})"
