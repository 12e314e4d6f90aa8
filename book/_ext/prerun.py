"""Sphinx extension: execute the chapters that time nothing two at a time, before Sphinx reads them.

MyST-NB executes a book's notebooks one after another. Most of this book's chapters keep one core busy,
so on a 2-core machine half of it idles through most of the build. This extension, at the start of each
build, executes every notebook Sphinx is about to read, two at a time, each kernel on one thread
(``OMP_NUM_THREADS=1``), and writes the executed notebooks into MyST-NB's jupyter-cache. MyST-NB then
reads them (execution mode ``cache``) and renders the cached outputs.

The chapters in ``prerun_first`` (the slowest) start first, so that the two lanes end close together.
Chapters listed in ``prerun_alone`` (in ``_config.yml``: those that time decoding live) are not run here.
MyST-NB finds no cached copy of them and executes them itself, one at a time, after every pre-run has
finished: nothing else runs beside them, and their kernels keep torch's default threads.

What stays as MyST-NB would do it:
- each notebook is read with MyST-NB's own reader, so its cache key (its code cells and kernel) is what
  MyST-NB looks up;
- it runs where MyST-NB would run it (an empty temporary folder with ``run_in_temp``), with MyST-NB's
  timeout, and errors are not allowed;
- a notebook that fails here is not cached, so MyST-NB executes it again and the strict build fails on it,
  with its traceback;
- the cache is emptied first, so every build executes every chapter, as ``execute_notebooks: force`` did
  (jupyter-cache cannot see changes to the library).
"""

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path

from sphinx.util import logging

LOGGER = logging.getLogger(__name__)
WORKERS = 2


def _execute(notebook, folder: Path, timeout: int, in_temp: bool):
    """Return (the executed notebook, seconds, the error text or None), run in ``folder`` or, with
    ``in_temp``, in an empty temporary folder, as MyST-NB runs it."""
    import tempfile

    from jupyter_cache.executors.utils import single_nb_execution

    with tempfile.TemporaryDirectory() if in_temp else nullcontext(str(folder)) as cwd:
        result = single_nb_execution(notebook, cwd=str(cwd), allow_errors=False, timeout=timeout,
                                     meta_override=True)
    error = None if result.err is None else f"{result.err.__class__.__name__}: {result.err}"
    return notebook, result.time, error


def _prerun(app, env, docnames):
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    from myst_nb.core.read import create_nb_reader

    config = env.mystnb_config
    if config.execution_mode != "cache":
        return
    cache_path = Path(config.execution_cache_path)
    shutil.rmtree(cache_path, ignore_errors=True)  # every build executes every chapter
    alone = set(app.config.prerun_alone)
    first = list(app.config.prerun_first)
    jobs = []
    for docname in sorted(docnames, key=lambda d: (first.index(d) if d in first else len(first), d)):
        path = Path(env.doc2path(docname))
        if docname in alone or path.suffix != ".md":
            continue
        text = path.read_text()
        reader = create_nb_reader(str(path), env.myst_config, config, text)
        if reader is None:  # a plain Markdown page, no code cells
            continue
        jobs.append((docname, path, reader.read(text)))
    if not jobs:
        return
    cache = get_cache(str(cache_path))
    started, threads = time.perf_counter(), os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # read by each kernel as it starts
    try:
        with ThreadPoolExecutor(WORKERS) as pool:
            futures = [(docname, path, pool.submit(_execute, nb, path.parent, config.execution_timeout,
                                                   config.execution_in_temp))
                       for docname, path, nb in jobs]
            for docname, path, future in futures:
                notebook, seconds, error = future.result()
                if error:  # left out of the cache: MyST-NB runs it again, and fails the build on it
                    LOGGER.warning(f"prerun: {docname} failed ({error}); MyST-NB will execute it again")
                    continue
                cache.cache_notebook_bundle(CacheBundleIn(notebook, str(path), data={"execution_seconds": seconds}),
                                            check_validity=False, overwrite=True)
                LOGGER.info(f"prerun: {docname} executed in {seconds:.1f} s")
    finally:
        if threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = threads
    LOGGER.info(f"prerun: {len(jobs)} notebooks in {time.perf_counter() - started:.1f} s, {WORKERS} at a time")


def setup(app):
    app.add_config_value("prerun_alone", [], "env")
    app.add_config_value("prerun_first", [], "env")
    app.connect("env-before-read-docs", _prerun, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
