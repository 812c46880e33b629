"""Run at the start of every Python process of a test run: `helpers.compile_cache` puts this
folder first on PYTHONPATH, which child processes inherit, and Python imports the first
`sitecustomize` module it finds there.

It turns off one piece of JAX's persistent compilation cache: with a size limit set (the run sets
one, because that is what makes JAX lock the cache folder around each read and write), every
write first lists the whole folder, stats every entry and reads its access-time file, to see
whether anything must be evicted (`jax._src.lru_cache.LRUCache._evict_if_needed`). A test run
writes thousands of entries (about 150 MB, far below the limit, so nothing is ever evicted), and
at a few thousand entries each scan cost 0.7 s on this machine, inside the lock that every other
process of the run waits on. The lock stays; only the scan goes. Nothing here imports jax: the
patch is applied when jax itself imports that module.
"""
import sys

TARGET = "jax._src.lru_cache"


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


def install() -> None:
    if TARGET not in sys.modules and not any(getattr(f, "patches_lru_cache", False)
                                             for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchLruCache())


install()
