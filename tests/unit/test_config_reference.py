"""README.md's configuration reference is generated from the settings classes and must match them."""

from pathlib import Path

import pytest

from teto import configref

pytestmark = pytest.mark.unit


def test_readme_configuration_reference_is_current():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert configref.splice(readme) == readme, "run: .venv/bin/python -m teto.configref --write"


def test_every_setting_has_a_description():
    import importlib

    for _, module, cls_name in configref.PARTS:
        cls = getattr(importlib.import_module(module), cls_name)
        missing = [n for n, f in cls.model_fields.items() if not f.description]
        assert not missing, f"{cls_name} fields without a description: {missing}"
