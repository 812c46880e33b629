"""Run at the start of every Python process of a test run: `helpers.compile_cache` puts this folder
first on PYTHONPATH, which children inherit. It removes the eviction scan of JAX's persistent
cache (why: above `_no_eviction_scan`) and installs the checkout guard's audit hook: any open,
listing, creation, removal or rename of a path under the checkout's runs/ is appended to the file
``$CLARIFYJAX_TEST_CHECKOUT_LOG`` names, with the test that ran, and fails the run."""
import os
import sys

TARGET = "jax._src.lru_cache"


# With a size limit set, every cache write first lists the whole folder, stats every entry and reads
# its access-time file to see whether anything must be evicted (`LRUCache._evict_if_needed`). A test
# run writes thousands of entries, far below the limit, so nothing is ever evicted, and each scan
# runs inside the lock every other process waits on. The lock stays; only the scan goes. Nothing
# here imports jax: the patch is applied when jax itself imports that module.
def _no_eviction_scan(self, *, additional_size=0):
    return None


class _PatchLruCache:
    """A meta-path finder that finds TARGET with the other finders and patches it once loaded.
    (This file may be loaded twice in a process, as `sitecustomize` and by the conftest: finders
    are recognised by `patches_lru_cache`, not by class.)"""

    patches_lru_cache = True

    def find_spec(self, name, path=None, target=None):
        if name != TARGET:
            return None
        for finder in sys.meta_path:
            if getattr(finder, "patches_lru_cache", False) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            module.LRUCache._evict_if_needed = _no_eviction_scan

        spec.loader.exec_module = exec_module
        return spec


RUNS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))), "runs")
AUDITED = {"open": 1, "os.listdir": 1, "os.scandir": 1, "os.mkdir": 1, "os.remove": 1, "os.rmdir": 1,
           "os.rename": 2}  # event -> how many of its first arguments are paths


def _audit_checkout(event, args):
    n = AUDITED.get(event)
    if n is None:
        return
    for path in args[:n]:
        if not isinstance(path, (str, bytes, os.PathLike)):
            continue  # a file descriptor
        path = os.path.abspath(os.fsdecode(path))
        if path == RUNS or path.startswith(RUNS + os.sep):
            log = os.environ.get("CLARIFYJAX_TEST_CHECKOUT_LOG")
            if log:
                if event == "open":  # arguments (path, mode, flags)
                    writes = (args[2] or 0) & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
                    event = "write" if writes else "read"
                test = os.environ.get("PYTEST_CURRENT_TEST", "outside a test")
                with open(log, "a", encoding="utf-8") as f:
                    f.write(f"{event}\t{path}\t{test}\n")


def install() -> None:
    if not getattr(sys, "clarifyjax_checkout_audit", False):
        sys.clarifyjax_checkout_audit = True  # once per process (this file may load twice)
        sys.addaudithook(_audit_checkout)
    if TARGET not in sys.modules and not any(getattr(f, "patches_lru_cache", False)
                                             for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchLruCache())


install()
