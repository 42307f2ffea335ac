"""The model file in a model directory: which kind it is, told from its zip entries
before torch reads it, so that a wrong file gets a message saying what it is and how
to save the right one, instead of torch's "PytorchStreamReader failed locating file
constants.pkl ... corrupted".

Nothing here unpickles anything, and torch is imported only to load: `serve` and the
gunicorn master read the constants and ModelLoadError without paying for torch.
"""

from __future__ import annotations

import io
import json
import os
import pickletools
import tokenize
import zipfile

from smserve import toolkit

EXPORTED = "model.pt2"
TORCHSCRIPT = "model.pt"

# The two forms that load without the model's Python class.
SAVE_FORMS = (
    "torch.export.save(torch.export.export(model, example_inputs), 'model.pt2') (preferred), "
    "or torch.jit.save(torch.jit.script(model), 'model.pt') (or torch.jit.trace(model, example_inputs))"
)
SAVE_IT_RIGHT = ("save the module in a form that loads without its Python class: " + SAVE_FORMS
                 + "; or load it yourself in code/inference.py's model_fn(model_dir)")


class ModelLoadError(RuntimeError):
    """The model cannot be loaded, for a reason the message names in full."""


def kind(path: str) -> str:
    """"export" (a torch.export.save archive), "torchscript" (torch.jit.save), "pickle"
    (torch.save of a module or a state_dict), "empty", or "unknown"."""
    if os.path.getsize(path) == 0:
        return "empty"
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as f:
            # Protocol 2+ pickles start with PROTO: torch.save's legacy format.
            return "pickle" if f.read(1) == b"\x80" else "unknown"
    with zipfile.ZipFile(path) as archive:
        names = {name.split("/", 1)[-1] for name in archive.namelist()}
    if "archive_format" in names:
        return "export"
    if "constants.pkl" in names:
        return "torchscript"
    if "data.pkl" in names:
        return "pickle"
    return "unknown"


def pickled_object(path: str) -> str:
    """What a torch.save file holds, by the first class its pickle names (read with
    pickletools, which does not execute it): "a pickled module (__main__.Net)", "a
    state_dict (weights only)", or "a pickle"."""
    try:
        with zipfile.ZipFile(path) as archive:
            data = next(archive.read(n) for n in archive.namelist() if n.split("/", 1)[-1] == "data.pkl")
        for opcode, arg, _ in pickletools.genops(data):
            if opcode.name == "GLOBAL":
                module, _, name = str(arg).partition(" ")
                if (module, name) in (("collections", "OrderedDict"), ("__builtin__", "dict"), ("builtins", "dict")):
                    return "a state_dict (weights only, no code)"
                return f"a pickled module ({module}.{name})"
    except (OSError, StopIteration, ValueError, zipfile.BadZipFile, KeyError):
        pass
    return "a pickle"


def check(path: str) -> None:
    """ModelLoadError when path is plainly not the kind its name promises (model.pt2:
    torch.export, model.pt: TorchScript), saying what it is instead and what to do. A
    file of no kind known here (an older torch's format?) is left for torch to judge."""
    expected = "export" if os.path.basename(path) == EXPORTED else "torchscript"  # (model.pt, or a lone *.pt/*.pth)
    found = kind(path)
    if found in (expected, "unknown"):
        return
    name = os.path.basename(path)
    if found == "pickle":
        what = pickled_object(path) if zipfile.is_zipfile(path) else "a pickle"
        if what.startswith("a state_dict"):
            raise ModelLoadError(
                f"{path} is {what}, saved with torch.save: the server loads a whole model, never a pickle. "
                "Save the module instead: " + SAVE_FORMS + "; or build it in code/inference.py's "
                "model_fn(model_dir) and load these weights there with torch.load(path, weights_only=True)")
        wanted = "a torch.export program" if expected == "export" else "TorchScript"
        raise ModelLoadError(
            f"{path} is {what}, saved with torch.save, not {wanted}: the server never unpickles "
            "(a pickle runs code, and needs your class to load). To serve it, " + SAVE_IT_RIGHT)
    if found == "export":
        raise ModelLoadError(f"{path} is a torch.export program (torch.export.save): name it {EXPORTED}, not {name}")
    if found == "torchscript":  # (only reached for model.pt2)
        raise ModelLoadError(f"{path} is a TorchScript module (torch.jit.save): name it {TORCHSCRIPT}, not {name}")
    raise ModelLoadError(f"{path} is empty: {SAVE_IT_RIGHT}")


def torchscript_file(model_dir: str, script: str = f"{toolkit.CODE_DIR}/{toolkit.DEFAULT_PROGRAM}") -> str | None:
    """The TorchScript file to serve: model.pt, else, as AWS's PyTorch toolkit loads
    one, the folder's only *.pt or *.pth file (None: there is none). It must still
    prove TorchScript (check): a pickled .pth is refused, never unpickled."""
    path = os.path.join(model_dir, TORCHSCRIPT)
    if os.path.isfile(path):
        return path
    found = toolkit.lone_model_files(model_dir)
    if len(found) > 1:
        raise ModelLoadError(f"{model_dir} holds {len(found)} model files ({', '.join(found[:5])}) and no {TORCHSCRIPT}: "
                             f"name the one to serve {TORCHSCRIPT}, or load them in {script}'s model_fn(model_dir)")
    return os.path.join(model_dir, found[0]) if found else None


# What torch.export.load reads of an archive without unpickling, under its one root
# folder: anything else (a pickled weight or constant, a torchbind or opaque object, an
# older layout's weights file, an AOTInductor library) is refused before torch reads it.
_EXPORT_FILES = frozenset((
    "archive_format", "archive_version", "byteorder", ".data/version", ".data/serialization_id",
    "models/model.json", "data/sample_inputs/model.pt",
    "data/weights/model_weights_config.json", "data/constants/model_constants_config.json"))
_EXTRA = "extra/"  # read as text
_PAYLOADS = {"data/weights/model_weights_config.json": ("data/weights/", "weight_"),
             "data/constants/model_constants_config.json": ("data/constants/", "tensor_")}
_SAMPLE_INPUTS = "data/sample_inputs/model.pt"
NO_PICKLE = ("the server never unpickles (a pickle runs code): export the model with plain tensors as its "
             "weights, constants and example inputs, or load it yourself in code/inference.py's model_fn(model_dir)")


def check_export_entries(path: str) -> None:
    """ModelLoadError unless every entry of the torch.export archive at path is one that
    torch.export.load reads without unpickling: each weight and constant plain tensor
    bytes its config describes (use_pickle false), nothing else but JSON and text. The
    graph and example inputs (a torch.save pickle in every archive): check_export_contents."""
    if kind(path) != "export":  # (an older layout: torch would unpickle its weights)
        raise ModelLoadError(f"{path} is not an archive of torch.export.save in this torch's layout: "
                             "export the model again with torch.export.save")
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        root = names[0].split("/", 1)[0] + "/" if names else ""
        inside = [name[len(root):] for name in names if name.startswith(root)]
        if len(inside) != len(names) or len(set(inside)) != len(inside):
            raise ModelLoadError(f"{path}: its entries are not one folder's, each once, as torch.export.save writes them")
        for name in inside:
            if name not in _EXPORT_FILES and not name.startswith(_EXTRA) and not _is_payload(name):
                raise ModelLoadError(f"{path} holds {name!r}, which torch.export.load would unpickle or run, or which "
                                     f"this server does not know: {NO_PICKLE}")
        present = set(inside)
        for config, (folder, prefix) in _PAYLOADS.items():
            if config not in present:
                raise ModelLoadError(f"{path} lacks {config}: save it with torch.export.save")
            try:
                payloads = json.loads(archive.read(root + config))["config"]
                items = payloads.items()
            except (ValueError, KeyError, TypeError, AttributeError):
                raise ModelLoadError(f"{path}: {config} is not the JSON torch.export.save writes") from None
            for fqn, meta in items:
                name = meta.get("path_name") if isinstance(meta, dict) else None
                if (not isinstance(name, str) or meta.get("use_pickle") is not False
                        or not isinstance(meta.get("tensor_meta"), dict) or not name.startswith(prefix)
                        or not _is_payload(folder + name) or folder + name not in present):
                    raise ModelLoadError(f"{path}: {fqn!r} in {config} is not stored as plain tensor bytes "
                                         f"(use_pickle, or an object's payload): {NO_PICKLE}")


def _is_payload(name: str) -> bool:
    """data/weights/weight_<n> or data/constants/tensor_<n>: raw tensor bytes."""
    for folder, prefix in _PAYLOADS.values():
        number = name[len(folder + prefix):]
        if name.startswith(folder + prefix) and number.isascii() and number.isdigit():
            return True
    return False


# The graph's symbolic shapes are read with sympy.sympify, which evaluates Python: an
# expression may name only sympy's arithmetic, torch's shape functions and symbols.
_SYMPY_NAMES = frozenset((
    "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Eq", "Ne", "Lt", "Le", "Gt", "Ge",
    "StrictLessThan", "StrictGreaterThan", "LessThan", "GreaterThan", "Unequality", "Equality",
    "And", "Or", "Not", "Abs", "floor", "ceiling", "Min", "Max", "oo", "zoo", "nan", "true", "false",
    "True", "False", "Piecewise", "ITE", "sqrt", "exp", "log", "pi", "E", "I",
    "positive", "negative", "nonnegative", "nonpositive", "integer", "real", "finite", "zero", "even", "odd",
    "commutative", "evaluate"))
_OPERATORS = frozenset("+ - * / // % ** ( ) , = == != < <= > >= & | ~ ^".split())
# Where a graph node's operator may come from (torch resolves any other dotted path
# from the torch module: torch.os.system too).
_TARGETS = ("torch.ops.", "_operator.", "math.", "torch.sym_", "torch._sym_", "#")


def _symbol(name: str) -> bool:
    """A shape symbol's name as torch makes them: letters then digits (s0, u3, zuf0)."""
    stem = name.rstrip("0123456789")
    return stem.isascii() and stem.isalpha() and len(stem) < len(name)


def _safe_expression(text: str, names: frozenset[str]) -> bool:
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return False
    for token in tokens:
        if token.type == tokenize.NAME:
            if token.string not in names and not _symbol(token.string):
                return False
        elif token.type == tokenize.STRING:
            if not _symbol(token.string.strip("'\"")):
                return False
        elif token.type == tokenize.OP:
            if token.string not in _OPERATORS:
                return False
        elif token.type not in (tokenize.NUMBER, tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER):
            return False
    return True


def _check_graph(path: str, program: object) -> None:
    """ModelLoadError for a graph (models/model.json) whose shape expressions or node
    targets reach beyond what torch.export writes."""
    from torch.utils._sympy import functions

    names = _SYMPY_NAMES | frozenset(getattr(functions, "__all__", ()))
    stack = [program]
    while stack:
        value = stack.pop()
        if isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, dict):
            for field, item in value.items():
                if field == "expr_str" and isinstance(item, str) and not _safe_expression(item, names):
                    raise ModelLoadError(f"{path}: the shape expression {item[:120]!r} in its graph is not one "
                                         "torch.export writes (it would be evaluated as Python)")
                if field == "target" and isinstance(item, str) and not item.startswith(_TARGETS):
                    raise ModelLoadError(f"{path}: its graph calls {item[:120]!r}, not an operator torch.export "
                                         f"writes ({', '.join(_TARGETS)}...)")
                stack.append(item)


def check_export_contents(path: str) -> None:
    """ModelLoadError unless the graph (models/model.json) holds only what torch.export
    writes, and the example inputs load with weights_only=True: torch.export.load
    unpickles them so first, and on any failure again with weights_only=False."""
    import torch

    with zipfile.ZipFile(path) as archive:
        root = archive.namelist()[0].split("/", 1)[0] + "/"
        graph, inputs = archive.read(root + "models/model.json"), archive.read(root + _SAMPLE_INPUTS)
    try:
        program = json.loads(graph)
    except ValueError:
        raise ModelLoadError(f"{path}: models/model.json is not the JSON torch.export.save writes") from None
    _check_graph(path, program)
    try:
        torch.load(io.BytesIO(inputs), weights_only=True)
    except Exception as e:  # noqa: BLE001 - whatever torch's restricted unpickler refuses
        raise ModelLoadError(f"{path}: its example inputs ({_SAMPLE_INPUTS}) are not plain tensors "
                             f"({type(e).__name__}): {NO_PICKLE}") from None


def load_exported(path: str):
    """The torch.export program in path (model.pt2), once its entries prove that loading
    it unpickles and evaluates nothing."""
    check(path)
    check_export_entries(path)
    check_export_contents(path)
    import torch

    from smserve.engine.model.weights import gil_free_reads

    with gil_free_reads():  # the event loop answers meanwhile, /ping included
        return torch.export.load(path)


def load_torchscript(path: str, map_location=None):
    """The TorchScript module in path (model.pt), in eval mode."""
    check(path)
    import torch

    return torch.jit.load(path, map_location=map_location).eval()
