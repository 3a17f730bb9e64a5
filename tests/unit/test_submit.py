"""`python -m trainer.submit`: dry runs of the shipped job shapes, usage errors,
and a real submission through the Vertex AI SDK to a local REST stand-in with
the package staged into gcp-storage-emulator."""

import os
import tarfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_sdist_name_is_derived_from_contents(tmp_path):
    from trainer.vertex import staging

    egg_info = os.path.join(REPO, "tfdist.egg-info")
    had_egg_info = os.path.exists(egg_info)
    first = staging.build_sdist(staging.find_project_root(), str(tmp_path / "a"))
    second = staging.build_sdist(staging.find_project_root(), str(tmp_path / "b"))
    assert first.staged_name == second.staged_name
    with tarfile.open(first.path) as archive:
        names = archive.getnames()
    assert "tfdist-0.1.0/trainer/submit.py" in names
    assert "tfdist-0.1.0/tfdist/distribute/cluster.py" in names
    assert not [name for name in names if "__pycache__" in name]
    assert os.path.exists(egg_info) == had_egg_info, "the build must not write into the checkout"
