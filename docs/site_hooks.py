"""mkdocs hook (mkdocs.yml `hooks:`): the pages link figures and results of the repository outside
docs/ (`../benchmarks/results/ppo_seeds.png`), which GitHub shows; the site copies each such file
that exists to `repo/<its path>` and points the link there. A link to a missing file is left as it
is, so that `mkdocs build --strict` still refuses it."""
from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

LINK = re.compile(r"(\]\()(\.\./[^)\s#]+)")
SITE_FOLDER = "repo"


def _outside(page_uri: str, target: str, docs: Path, repo: Path) -> str | None:
    """The repository path of a link that leaves docs/ for an existing file, else None."""
    path = (docs / posixpath.dirname(page_uri) / target).resolve()
    if path.is_relative_to(docs) or not path.is_relative_to(repo) or not path.is_file():
        return None
    return path.relative_to(repo).as_posix()


def on_files(files, config):
    docs = Path(config["docs_dir"]).resolve()
    repo = Path(config["config_file_path"]).resolve().parent
    wanted = set()
    for page in files.documentation_pages():
        for _, target in LINK.findall(Path(page.abs_src_path).read_text(encoding="utf-8")):
            if (found := _outside(page.src_uri, target, docs, repo)) is not None:
                wanted.add(found)
    for path in sorted(wanted):
        files.append(File.generated(config, f"{SITE_FOLDER}/{path}", abs_src_path=str(repo / path)))
    return files


def on_page_markdown(markdown, page, config, files):
    docs = Path(config["docs_dir"]).resolve()
    repo = Path(config["config_file_path"]).resolve().parent

    def relink(match: re.Match) -> str:
        found = _outside(page.file.src_uri, match[2], docs, repo)
        if found is None:
            return match[0]
        return match[1] + posixpath.relpath(f"{SITE_FOLDER}/{found}", posixpath.dirname(page.file.src_uri) or ".")

    return LINK.sub(relink, markdown)
