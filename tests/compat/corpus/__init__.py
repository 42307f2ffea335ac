"""The compat corpus: inference scripts in the styles users write for AWS's PyTorch
containers, each in <name>/ with code/ (the script, as in a model.tar.gz), make_model.py
(`build(model_dir, requests_dir)`: its tiny seeded model and any generated request
files) and requests/ (request files, their types from their names or manifest.json)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

CORPUS = Path(__file__).resolve().parent
ENTRIES = sorted(p.name for p in CORPUS.iterdir() if (p / "make_model.py").exists())


def load_script(model_dir: Path, name: str = "inference.py"):
    """A module of the entry's code/ (its script, or a sibling such as model.py) loaded
    by path, to build its model with its own classes. Modules of this checkout with a
    sibling's name (the project's own `model` package) are set aside meanwhile, so the
    script's `from model import Net` finds its sibling; the siblings are forgotten after,
    so entries never share one."""
    code = Path(model_dir / "code")
    siblings = {p.stem for p in code.glob("*.py")} | {p.name for p in code.iterdir() if (p / "__init__.py").exists()}
    aside = {n: m for n, m in sys.modules.items() if n.split(".")[0] in siblings}
    for n in aside:
        del sys.modules[n]
    sys.path.insert(0, str(code))
    try:
        spec = importlib.util.spec_from_file_location(f"compat_corpus_{model_dir.parent.name}_{Path(name).stem}", code / name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(code))
        for n in [n for n in sys.modules if n.split(".")[0] in siblings]:
            del sys.modules[n]
        sys.modules.update(aside)


def materialize(entry: str, into: Path) -> tuple[Path, Path, dict[str, str]]:
    """(model folder, requests folder, environment both sides need: make_model.ENV) of
    an entry, built under into."""
    model_dir, requests_dir = into / "model", into / "requests"
    shutil.copytree(CORPUS / entry / "code", model_dir / "code")
    if (CORPUS / entry / "requests").is_dir():  # some entries make all theirs in build()
        shutil.copytree(CORPUS / entry / "requests", requests_dir)
    requests_dir.mkdir(exist_ok=True)
    spec = importlib.util.spec_from_file_location(f"compat_make_{entry}", CORPUS / entry / "make_model.py")
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    maker.build(model_dir, requests_dir)
    return model_dir, requests_dir, dict(getattr(maker, "ENV", {}))
