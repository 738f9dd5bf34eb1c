"""The baseline's kernel at a git commit: ``baseline.kernel_rev``.

``baseline.kernel_rev: <commit>`` makes the baseline run ``kernel.module``'s file as it was at that
commit (what ``git show <sha>:kernels/<file>.py`` prints), while the candidate runs this working
tree's file: a kernel *code* change is A/B'd in one run, interleaved, like a launch-config change.
Everything else (the launcher's inputs, the reference, flops and bytes) comes from the working tree's
module, so both sides run on the same inputs.

* :func:`resolve_kernel_rev` (the run spec, at parse time; read-only, no file written): the full
  40-hex sha that ``git rev-parse --verify <rev>^{commit}`` gives in this tree's repository, and the
  kernel file's bytes at that commit with their sha256 (the baseline's kernel source hash). A full
  sha this tree's repository lacks (a queued experiment's copy holds only its own history) is looked
  up in ``$DVC_ROOT``'s too; a name (branch, tag, ``HEAD~1``) only here, where it was meant.
* :func:`import_kernel_rev` (build, benchmark and verify, for the baseline): writes the file once into
  ``$DVC_ROOT/.kernelcamp/kernel_revs/kcrev_<sha>_<file>.py`` (content-addressed: a commit's file has
  one name; written atomically; reused while its bytes match) and imports it as the top-level module
  ``kcrev_<sha>_<file>``, so both kernel versions live in one process. Its ``@triton.jit`` functions
  are its own: Triton keys compiled kernels by their source, so the two versions compile and cache
  independently. The folder is put on ``sys.path`` (last): the build's compile subprocess imports
  kernels by module name, with the parent's ``sys.path``.

The file must be self-contained (today's kernel imports only torch and triton): an import of another
module of ``kernels/`` would come from the working tree, not from the commit, so it is refused.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import re
import subprocess
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

from kernelcamp.errors import KernelcampError
from kernelcamp.hashes import kernel_path, project_root
from kernelcamp.io import atomic_path
from kernelcamp.provenance import dvc_root

WHERE = "baseline.kernel_rev"
#: Folder of the materialized files, under the workspace's ``.kernelcamp/``.
CACHE_SUBDIR = "kernel_revs"
MODULE_PREFIX = "kcrev_"
_SHA_RE = re.compile(r"^[0-9a-f]{40}$")
_BAD_REV_RE = re.compile(r"^-|[\s\x00-\x1f\x7f]|^$")


@dataclass(frozen=True)
class KernelRev:
    """``kernel.module``'s file at one commit.

    ``rev``: as given; ``sha``: the full commit sha; ``path``: the file relative to the tree
    (``kernels/<file>.py``); ``source_hash``: sha256 hex of its bytes (as :func:`kernelcamp.hashes.kernel_source_hash`
    hashes the working tree's); ``source``: the bytes; ``repo``: the working tree git read it from.
    """

    rev: str
    sha: str
    path: str
    source_hash: str
    repo: Path
    source: bytes = field(repr=False, compare=False)

    def module_name(self) -> str:
        """``kcrev_<sha>_<file>``: unique per commit and kernel file."""
        return f"{MODULE_PREFIX}{self.sha}_{Path(self.path).stem}"


def rev_of_module(name: str) -> str | None:
    """The commit sha in a module name :meth:`KernelRev.module_name` made, else None."""
    m = re.match(rf"^{MODULE_PREFIX}([0-9a-f]{{40}})_", name)
    return m.group(1) if m else None


def module_source(module: types.ModuleType) -> dict[str, str | None]:
    """What a record says of a kernel module that ran: ``module`` (its name; ``kcrev_<sha>_<file>`` for
    the file at ``baseline.kernel_rev``), ``kernel_rev`` (that commit's full sha; None for the working
    tree's file) and ``source_hash`` (sha256 hex of the file's bytes, as
    :func:`kernelcamp.hashes.kernel_source_hash` hashes the working tree's)."""
    return {
        "module": module.__name__,
        "kernel_rev": rev_of_module(module.__name__),
        "source_hash": hashlib.sha256(Path(module.__file__).read_bytes()).hexdigest(),
    }


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=60)
    except FileNotFoundError:
        raise KernelcampError(f"{WHERE}: git is not installed, and it reads the baseline's kernel") from None
    except subprocess.TimeoutExpired:
        raise KernelcampError(f"{WHERE}: git did not answer within 60 s in {repo}") from None


def _is_git_repo(repo: Path) -> bool:
    return _git(repo, "rev-parse", "--git-dir").returncode == 0


def _kernels_imports(tree: ast.Module) -> list[str]:
    """Modules of the ``kernels`` package (or relative ones) that a parsed kernel file imports."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level or mod == "kernels" or mod.startswith("kernels."):
                found.append("." * node.level + mod)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name == "kernels" or a.name.startswith("kernels.")]
    return found


#: What the stages call on a kernel module, the working tree's and the baseline's (build: compile_specs; benchmark,
#: verify: the launcher).
REQUIRED_NAMES = ("SparseMLADecode", "compile_specs")


def _top_level_names(tree: ast.Module) -> set[str]:
    """Names a parsed module binds at its top level (defs, classes, assignments, imports)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


@functools.lru_cache(maxsize=8)
def _parsed(source: bytes) -> ast.Module:
    """``ast.parse(source)``, kept for the same bytes: spec parses the kernel file (120 KB, 0.1 s) at every stage."""
    return ast.parse(source)


def parse_kernel(source: bytes, where: str) -> ast.Module:
    """A kernel file's bytes ``source`` parsed (treat the tree as read-only: it is shared). Raises ``KernelcampError``
    "``<where>`` is not valid Python (...)" for a file that does not parse."""
    try:
        return _parsed(source)
    except (SyntaxError, ValueError) as e:
        raise KernelcampError(f"{where} is not valid Python ({e})") from None


def check_kernel_api(tree: ast.Module, where: str, whose: str, fix: str) -> None:
    """The one check that a parsed kernel file (:func:`parse_kernel`) has what the stages call on it: every name of
    :data:`REQUIRED_NAMES` bound at its top level. For ``baseline.kernel_rev``'s file (:func:`resolve_kernel_rev`)
    and the working tree's ``kernel.module`` (:func:`kernelcamp.spec.parse_spec`), so a file without them stops at
    spec, not at build. Raises ``KernelcampError`` "``<where>`` defines no compile_specs, which build, benchmark and
    verify call on ``<whose>``; ``<fix>``"."""
    missing = [n for n in REQUIRED_NAMES if n not in _top_level_names(tree)]
    if missing:
        raise KernelcampError(
            f"{where} defines no {missing[0]}, which build, benchmark and verify call on {whose}; {fix}"
        )


def resolve_kernel_rev(rev: object, module: str, root: Path | None = None) -> KernelRev:
    """Resolve ``baseline.kernel_rev`` = ``rev`` for kernel module ``module`` (``kernels.<file>``).

    ``root``: the working tree (default: this one, :func:`kernelcamp.hashes.project_root`). Runs git
    read-only and writes nothing. Raises ``KernelcampError`` (one line: what is wrong, what to do) for
    a value that is not a git revision, a tree without git, a revision git cannot resolve to a commit,
    a commit without the kernel file, or a file there that is not valid Python, imports another
    module of ``kernels/`` or lacks a name of :data:`REQUIRED_NAMES`. In a queued experiment's copy
    (``root`` is not ``$DVC_ROOT``) only full shas are looked up in the workspace too: the copy has no
    branches or tags, and the message for a name says to queue the full sha.
    """
    if not isinstance(rev, str) or _BAD_REV_RE.search(rev):
        raise KernelcampError(
            f"{WHERE} = {rev!r}: expected a git commit (a full 40-hex sha, or a name git rev-parse resolves, "
            "e.g. a tag); null runs the working tree's kernel on both sides"
        )
    root = (root or project_root()).resolve()
    rel = kernel_path(module, root).relative_to(root).as_posix()
    if not _is_git_repo(root):
        raise KernelcampError(
            f"{WHERE} = {rev!r}: {root} is not in a git repository, so there is no commit to take "
            f"{rel} from; run from a git clone or set {WHERE} to null"
        )
    repos = [root]
    workspace = dvc_root()
    if _SHA_RE.fullmatch(rev) and workspace != root and _is_git_repo(workspace):
        repos.append(workspace)  # a queued experiment's copy may lack a commit the workspace has
    for repo in repos:
        r = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
        if r.returncode == 0:
            sha = r.stdout.decode().strip()
            break
    else:
        if workspace != root and not _SHA_RE.fullmatch(rev):
            raise KernelcampError(
                f"{WHERE} = {rev!r}: git rev-parse finds no commit of that name in {root}, a copy of the "
                f"workspace {workspace} without its branches and tags (a queued experiment's): queue the full "
                f"sha instead (`git rev-parse {rev}` in the workspace prints it)"
            )
        raise KernelcampError(
            f"{WHERE} = {rev!r}: git rev-parse finds no commit of that name in {root}; give a commit that "
            f"has the kernel (`git log --oneline -- {rel}` lists them), preferably its full sha"
        )
    blob = _git(repo, "cat-file", "blob", f"{sha}:./{rel}")
    if blob.returncode != 0:
        raise KernelcampError(
            f"{WHERE} = {rev!r} (commit {sha[:12]}): {rel} does not exist at that commit (kernel.module = "
            f"{module!r}); pick a commit that has it: `git log --oneline -- {rel}`"
        )
    source = blob.stdout
    where = f"{WHERE} = {rev!r} (commit {sha[:12]}): {rel} there"
    tree = parse_kernel(source, where)
    siblings = _kernels_imports(tree)
    if siblings:
        raise KernelcampError(
            f"{where} imports {siblings[0]}, which would come from the working tree, not from that commit; kernel_rev "
            "takes a self-contained kernel file"
        )
    api = ", ".join(REQUIRED_NAMES)
    check_kernel_api(
        tree, where, "the baseline's kernel", f"pick a commit whose kernel has the working tree's API ({api})"
    )
    return KernelRev(rev, sha, rel, hashlib.sha256(source).hexdigest(), repo, source)


def cache_dir(root: Path | None = None) -> Path:
    """``<root or $DVC_ROOT or cwd>/.kernelcamp/kernel_revs``: shared by the workspace, its queued
    experiments and sweep workers (its files are named by commit, so they never disagree)."""
    return (Path(root) if root is not None else dvc_root()) / ".kernelcamp" / CACHE_SUBDIR


def materialize(kr: KernelRev, cache_root: Path | None = None) -> Path:
    """Write ``kr``'s file as ``<cache_dir>/kcrev_<sha>_<file>.py`` (atomically; left alone when its
    bytes already match) and return its path. Raises ``KernelcampError`` when it cannot be written."""
    path = cache_dir(cache_root) / f"{kr.module_name()}.py"
    try:
        if path.is_file() and path.read_bytes() == kr.source:
            return path
        with atomic_path(path) as tmp:
            tmp.write_bytes(kr.source)
    except OSError as e:
        raise KernelcampError(f"{WHERE}: cannot write the baseline's kernel file {path}: {e}") from None
    return path


def import_kernel_rev(
    module: str, rev: str, root: Path | None = None, cache_root: Path | None = None
) -> types.ModuleType:
    """``module``'s file at commit ``rev`` (:func:`resolve_kernel_rev`), imported as its own module
    ``kcrev_<sha>_<file>`` from the cache folder (:func:`materialize`); see the module docstring.

    Raises ``KernelcampError`` as :func:`resolve_kernel_rev` does, and when the file fails to import
    or another file of that name was imported before (its source hash differs).
    """
    kr = resolve_kernel_rev(rev, module, root)
    name = kr.module_name()
    loaded = sys.modules.get(name)
    if loaded is None:
        path = materialize(kr, cache_root)
        folder = str(path.parent)
        if folder not in sys.path:
            sys.path.append(folder)
        importlib.invalidate_caches()  # the folder's listing may predate the file
        try:
            loaded = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any import failure of the baseline's kernel is one line
            raise KernelcampError(
                f"{WHERE} = {rev!r}: {kr.path} at {kr.sha[:12]} does not import: {type(e).__name__}: {e}"
            ) from e
    got = Path(getattr(loaded, "__file__", "") or "")
    if not got.is_file() or hashlib.sha256(got.read_bytes()).hexdigest() != kr.source_hash:
        raise KernelcampError(
            f"{WHERE} = {rev!r}: module {name} was imported from {got}, whose bytes are not {kr.path} at "
            f"{kr.sha[:12]}; remove {got} and run the stage again"
        )
    return loaded
