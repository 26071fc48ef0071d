"""Task folders to the tar the API's upload takes."""
from __future__ import annotations

import io
import os
import tarfile
from typing import List, Union

PathArg = Union[str, "os.PathLike[str]"]


class TaskFolderError(ValueError):
    """A folder that cannot be uploaded as a task (it names the path)."""


def task_folders(root: PathArg) -> List[str]:
    """The task folders under ``root`` (or ``root`` itself when it has a task.yaml or task.toml), by name."""
    top = os.fspath(root)
    marks = ("task.yaml", "task.toml")
    if any(os.path.isfile(os.path.join(top, m)) for m in marks):
        return [top]
    if not os.path.isdir(top):
        raise TaskFolderError("%s: not a folder" % top)
    found = sorted(
        os.path.join(top, name) for name in os.listdir(top)
        if any(os.path.isfile(os.path.join(top, name, m)) for m in marks)
    )
    if not found:
        raise TaskFolderError("%s: no task folder (a folder with task.yaml) in it" % top)
    return found


def tar_task(folder: PathArg) -> bytes:
    """A plain tar of the folder's contents (task.yaml, workspace/, tests/, solution/ at the top)."""
    path = os.fspath(folder)

    def no_links(info: tarfile.TarInfo) -> tarfile.TarInfo:
        if info.issym() or info.islnk():
            raise TaskFolderError("%s: a link; the API takes plain files and folders only" % os.path.join(path, info.name))
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(path, arcname=".", filter=no_links)
    return buffer.getvalue()
