"""MkDocs hook: adds the generated reference pages (hetmm_ray/reference.py) to the site at build time.

Each page of ``hetmm_ray.reference.pages()`` becomes a file of the build, as if it were in ``docs/``;
nothing is written to ``docs/``, so ``mkdocs build --strict`` alone builds a complete site.
"""

from __future__ import annotations

from mkdocs.structure.files import File, Files

from hetmm_ray.reference import pages


def on_files(files: Files, config) -> Files:
    for path, text in pages().items():
        existing = files.get_file_from_path(path)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, path, content=text))
    return files
