"""A PEP 517 build backend for this package, standard library only (see pyproject.toml for why).

It builds a pure-Python wheel of the ``rollout_fleet`` folder (its .py files and py.typed), an sdist of
this folder, and an editable wheel (a .pth file naming this folder) for ``pip install -e``.
"""
from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "rollout_fleet"


def _project() -> Dict[str, str]:
    with open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    project = text.split("[project]", 1)[1]
    found = {}
    for key in ("name", "version", "description", "requires-python"):
        match = re.search(r'^%s\s*=\s*"([^"]*)"' % re.escape(key), project, re.M)
        if match is None:
            raise RuntimeError("pyproject.toml: [project] has no %s" % key)
        found[key] = match.group(1)
    return found


def _dist_name() -> Tuple[str, str]:
    p = _project()
    return p["name"].replace("-", "_"), p["version"]


def _metadata() -> bytes:
    p = _project()
    lines = [
        "Metadata-Version: 2.1",
        "Name: %s" % p["name"],
        "Version: %s" % p["version"],
        "Summary: %s" % p["description"],
        "Requires-Python: %s" % p["requires-python"],
        "License: Apache-2.0",
        "",
    ]
    return "\n".join(lines).encode()


def _wheel_file() -> bytes:
    return b"Wheel-Version: 1.0\nGenerator: rollout_fleet_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _package_files() -> List[Tuple[str, bytes]]:
    files = []
    root = os.path.join(HERE, PACKAGE)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py") or name == "py.typed":
                full = os.path.join(dirpath, name)
                with open(full, "rb") as f:
                    files.append((os.path.relpath(full, HERE).replace(os.sep, "/"), f.read()))
    return files


def _write_wheel(directory: str, files: List[Tuple[str, bytes]]) -> str:
    name, version = _dist_name()
    info = "%s-%s.dist-info" % (name, version)
    entries = files + [
        (info + "/METADATA", _metadata()),
        (info + "/WHEEL", _wheel_file()),
        (info + "/top_level.txt", (PACKAGE + "\n").encode()),
    ]
    record = []
    for path, data in entries:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (path, digest, len(data)))
    record.append(info + "/RECORD,,")
    filename = "%s-%s-py3-none-any.whl" % (name, version)
    with zipfile.ZipFile(os.path.join(directory, filename), "w", zipfile.ZIP_DEFLATED) as wheel:
        for path, data in entries + [(info + "/RECORD", ("\n".join(record) + "\n").encode())]:
            wheel.writestr(zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return filename


def get_requires_for_build_wheel(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[dict] = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: Optional[dict] = None) -> str:
    name, version = _dist_name()
    info = "%s-%s.dist-info" % (name, version)
    os.makedirs(os.path.join(metadata_directory, info), exist_ok=True)
    with open(os.path.join(metadata_directory, info, "METADATA"), "wb") as f:
        f.write(_metadata())
    with open(os.path.join(metadata_directory, info, "WHEEL"), "wb") as f:
        f.write(_wheel_file())
    return info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory: str, config_settings: Optional[dict] = None, metadata_directory: Optional[str] = None) -> str:
    return _write_wheel(wheel_directory, _package_files())


def build_editable(wheel_directory: str, config_settings: Optional[dict] = None, metadata_directory: Optional[str] = None) -> str:
    return _write_wheel(wheel_directory, [("rollout_fleet_editable.pth", (HERE + "\n").encode())])


def build_sdist(sdist_directory: str, config_settings: Optional[dict] = None) -> str:
    name, version = _dist_name()
    base = "%s-%s" % (name, version)
    filename = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz", format=tarfile.PAX_FORMAT) as tar:
        extra = [("pyproject.toml", None), ("README.md", None), ("build_backend/rollout_fleet_build.py", None)]
        paths = [p for p, _ in extra] + [p for p, _ in _package_files()]
        for path in paths:
            full = os.path.join(HERE, path)
            if os.path.exists(full):
                tar.add(full, arcname=base + "/" + path)
        info = tarfile.TarInfo(base + "/PKG-INFO")
        data = _metadata()
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return filename
