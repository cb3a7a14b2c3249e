"""The PGXN distribution: META.json against the PGXN Meta Spec 1.0.0 (https://pgxn.org/meta/spec.txt)
and the archive of `make dist`, unpacked into a clean directory, built and installed there.

The install goes into a DESTDIR under a temporary directory, never into the server's own
directories; the archive is of the committed tree (git archive HEAD)."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import zipfile

REPO = pathlib.Path(__file__).resolve().parents[2]
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z-]+)?$")
# The spec's license strings (section "license").
LICENSES = {
    "agpl_3", "apache_1_1", "apache_2_0", "artistic_1", "artistic_2", "bsd", "freebsd",
    "gfdl_1_2", "gfdl_1_3", "gpl_1", "gpl_2", "gpl_3", "lgpl_2_1", "lgpl_3_0", "mit",
    "mozilla_1_0", "mozilla_1_1", "openssl", "perl_5", "postgresql", "qpl_1_0", "ssleay", "sun",
    "zlib", "open_source", "restricted", "unrestricted", "unknown",
}
REQUIRED = ("name", "abstract", "version", "maintainer", "license", "provides", "meta-spec")


def control_version(root=REPO):
    text = (root / "pg_eventbox.control").read_text()
    return re.search(r"^default_version = '([^']+)'", text, re.M).group(1)


def pg_config():
    if os.environ.get("PG_CONFIG"):
        return os.environ["PG_CONFIG"]
    pgbin = os.environ.get("EVENTBOX_PGBIN")
    if pgbin and os.path.exists(os.path.join(pgbin, "pg_config")):
        return os.path.join(pgbin, "pg_config")
    return shutil.which("pg_config") or "/usr/lib/postgresql/15/bin/pg_config"


def check_meta(meta, root):
    """The spec's required keys and their forms; the versions agree with the control file."""
    missing = [k for k in REQUIRED if k not in meta]
    assert not missing, "META.json lacks required keys %s" % missing
    assert meta["name"] == "pg_eventbox"
    assert re.fullmatch(r"[^\s/\\]+", meta["name"])
    assert isinstance(meta["abstract"], str) and meta["abstract"].strip()
    assert SEMVER.match(meta["version"]), "version %r is not SemVer" % meta["version"]
    assert meta["version"] == control_version(root), \
        "META.json version %s, pg_eventbox.control default_version %s" % (
            meta["version"], control_version(root))
    maintainers = meta["maintainer"]
    if isinstance(maintainers, str):
        maintainers = [maintainers]
    assert maintainers and all(isinstance(m, str) and m.strip() for m in maintainers)
    licenses = meta["license"]
    if isinstance(licenses, str):
        assert licenses in LICENSES, "license %r is none of the spec's strings" % licenses
    else:
        assert isinstance(licenses, dict) and licenses, "license: a string or a name -> URL map"
    assert meta["meta-spec"]["version"] == "1.0.0"
    assert meta.get("release_status", "stable") in ("stable", "testing", "unstable")
    assert meta["provides"], "provides names no extension"
    for ext, p in meta["provides"].items():
        assert {"file", "version"} <= set(p), "provides.%s needs file and version" % ext
        assert SEMVER.match(p["version"])
        assert p["version"] == meta["version"]
        assert (root / p["file"]).is_file(), "provides.%s.file %s missing" % (ext, p["file"])
        if "docfile" in p:
            assert (root / p["docfile"]).is_file()
    assert "pg_eventbox" in meta["provides"]
    req = meta["prereqs"]["runtime"]["requires"]["PostgreSQL"]
    assert re.match(r">= ?15\.0\.0", req), "PostgreSQL prereq %r" % req
    for k in meta.get("resources", {}).values():
        url = k if isinstance(k, str) else k.get("web") or k.get("url")
        assert url and url.startswith("https://")


def test_meta_json_follows_the_spec():
    check_meta(json.loads((REPO / "META.json").read_text()), REPO)


def unzip(archive, dest):
    """Unpacks like unzip(1) would: the files' modes from the archive (zipfile drops them)."""
    with zipfile.ZipFile(archive) as z:
        for info in z.infolist():
            z.extract(info, dest)
            mode = info.external_attr >> 16
            if mode and not info.is_dir():
                os.chmod(os.path.join(dest, info.filename), mode & 0o777)
        return z.namelist()


def test_dist_archive_builds_and_installs_from_a_clean_directory():
    version = control_version()
    subprocess.run(["make", "-s", "dist"], cwd=REPO, check=True, timeout=120)
    archive = REPO / "build" / "dist" / ("pg_eventbox-%s.zip" % version)
    assert archive.is_file()
    work = pathlib.Path(tempfile.mkdtemp(prefix="eb-pgxn.", dir="/tmp"))
    try:
        names = unzip(archive, work)
        prefix = "pg_eventbox-%s/" % version
        assert all(n.startswith(prefix) for n in names), "entries outside %s" % prefix
        src = work / prefix.rstrip("/")
        check_meta(json.loads((src / "META.json").read_text()), src)
        pgc = pg_config()
        env = dict(os.environ, PG_CONFIG=pgc)
        for cmd in (["make", "-j2"], ["make", "install", "DESTDIR=%s" % (work / "root")]):
            r = subprocess.run(cmd, cwd=src, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=1800)
            assert r.returncode == 0, "%s failed:\n%s" % (cmd, r.stdout.decode()[-3000:])

        def config(opt):
            return subprocess.run([pgc, opt], check=True, stdout=subprocess.PIPE,
                                  timeout=30).stdout.decode().strip()
        root = str(work / "root")
        libdir = pathlib.Path(root + config("--pkglibdir"))
        extdir = pathlib.Path(root + config("--sharedir")) / "extension"
        assert (libdir / "pg_eventbox.so").is_file()
        assert (extdir / "pg_eventbox.control").is_file()
        assert (extdir / ("pg_eventbox--%s.sql" % version)).is_file()
        installed = sorted(p.name for p in extdir.iterdir())
        shipped = sorted(["pg_eventbox.control"] +
                         [p.name for p in (src / "extension").glob("pg_eventbox--*.sql")])
        assert installed == shipped
    finally:
        shutil.rmtree(work, ignore_errors=True)
