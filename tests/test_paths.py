"""mwm.paths: output roots given on the command line."""

import os
import stat

import pytest

import mwm.paths as paths
from mwm.paths import UnsafePathError
from mwm.plan.runs import checkpoint_dir, run_dir


def test_the_filesystem_root_is_no_output_root():
    with pytest.raises(UnsafePathError, match="the filesystem root is not an output folder"):
        paths.check_out_root("/")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
@pytest.mark.parametrize("path", ["/proc", "/proc/results"])
def test_a_folder_no_file_can_be_made_in_is_refused_whoever_runs(path):
    with pytest.raises(UnsafePathError, match=rf"--out {path} is not a writable folder"):
        paths.check_out_root(path)


def test_a_file_is_no_output_root_nor_a_parent_of_one(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(UnsafePathError, match="is not a folder"):
        paths.check_out_root(tmp_path / "f")
    with pytest.raises(UnsafePathError, match="so no folder can be made under it"):
        paths.check_out_root(tmp_path / "f" / "results", what="--results")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_folder_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(UnsafePathError, match="not a writable folder"):
            paths.check_out_root(ro / "results")
    finally:
        ro.chmod(stat.S_IRWXU)


def test_a_new_or_existing_folder_is_accepted_and_nothing_is_created(tmp_path):
    assert paths.check_out_root(tmp_path) == tmp_path
    assert paths.check_out_root(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert list(tmp_path.iterdir()) == []


# -- paths stay inside their parent ----------

def test_inside_refuses_escapes(tmp_path):
    from mwm.paths import UnsafePathError, inside

    assert inside(tmp_path, "ci", "hetero", "seed0") == tmp_path / "ci" / "hetero" / "seed0"
    for parts in ([".."], ["."], ["ci", ".."], ["a/../.."], ["/etc"], ["ci", ""]):
        with pytest.raises(UnsafePathError):
            inside(tmp_path, *parts)
    # a symlink you make on purpose (a data folder on another disk) is followed
    (tmp_path / "link").symlink_to(tmp_path.parent)
    assert inside(tmp_path, "link") == tmp_path / "link"
    for build in (run_dir, checkpoint_dir):
        with pytest.raises(UnsafePathError):
            build(tmp_path, "..", "hetero", 0)
        with pytest.raises(UnsafePathError):
            build(tmp_path, "ci", "..", 0)


def test_data_folder_stays_inside_data_root(tmp_path):
    from mwm.data import dataset_dir

    assert dataset_dir({"corpus": "shakespeare"}, root=tmp_path).parent == tmp_path


def test_a_file_of_the_checkout_is_named_relative_to_it_and_one_outside_absolutely(tmp_path):
    repo, outside = tmp_path / "repo", tmp_path / "other"
    (repo / "config").mkdir(parents=True)
    outside.mkdir()
    assert paths.checkout_relative(repo / "config" / "ci.yaml", root=repo) == os.path.join("config", "ci.yaml")
    assert paths.checkout_relative(str(repo / "config" / ".." / "config" / "ci.yaml"), root=repo) == \
        os.path.join("config", "ci.yaml")
    assert paths.checkout_relative(outside / "x.yaml", root=repo) == str((outside / "x.yaml").resolve())
    # a moved checkout names its file the same way
    moved = tmp_path / "moved"
    repo.rename(moved)
    assert paths.checkout_relative(moved / "config" / "ci.yaml", root=moved) == os.path.join("config", "ci.yaml")


def test_leads_out_finds_a_folder_linked_out_of_the_root(tmp_path):
    from mwm.paths import leads_out

    root, scratch = tmp_path / "repo", tmp_path / "scratch"
    (root / "results").mkdir(parents=True)
    scratch.mkdir()
    (root / "data").symlink_to(scratch, target_is_directory=True)
    assert leads_out(root / "data" / "set" / "train.bin", root) == str(scratch / "set")  # not made yet
    assert leads_out(root / "results" / "runs" / "x.json", root) is None
    (root / "results" / "runs").symlink_to(root / "results", target_is_directory=True)  # inside: fine
    assert leads_out(root / "results" / "runs" / "x.json", root) is None
