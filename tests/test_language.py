"""tinytf.notebook_language: the running notebook's edition, always read from notebook metadata."""

from __future__ import annotations

import json

import pytest

from tinytf.checks import glance_table
from tinytf.language import edition_folder, edition_of, notebook_language


def _nb(path, lang=None):
    meta = {"tinytf": {"edition": lang}} if lang else {}
    path.write_text(json.dumps({"cells": [], "metadata": meta, "nbformat": 4, "nbformat_minor": 5}), encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    monkeypatch.delenv("TINYTF_LANG", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)


def test_edition_of_reads_metadata_and_defaults_to_english():
    assert edition_of({"metadata": {"tinytf": {"edition": "zh"}}}) == "zh"
    assert edition_of({"metadata": {}}) == edition_of({}) == "en"
    assert edition_of({"metadata": {"tinytf": {"edition": "fr"}}}) == "en", "an unknown edition is English"
    assert edition_of({"metadata": {"tinytf": "zh"}}) == "en", "malformed metadata does not raise"


def test_the_environment_wins(monkeypatch, tmp_path):
    _nb(tmp_path / "a.ipynb", "zh")
    monkeypatch.setenv("TINYTF_LANG", "en")
    assert notebook_language() == "en"


def test_jupyterlab_session_notebook_metadata(monkeypatch, tmp_path):
    (tmp_path / "zh").mkdir()
    _nb(tmp_path / "zh" / "ex01.ipynb", "zh")
    _nb(tmp_path / "ex01.ipynb")
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "zh" / "ex01.ipynb"))
    assert notebook_language() == "zh"
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "ex01.ipynb"))
    assert notebook_language() == "en"


def test_working_directory_of_one_edition(tmp_path):
    assert notebook_language() == "en", "no notebook: English"
    _nb(tmp_path / "a.ipynb", "zh")
    _nb(tmp_path / "b.ipynb", "zh")
    assert notebook_language() == "zh"
    _nb(tmp_path / "c.ipynb")
    assert notebook_language() == "en", "mixed editions: no guess"
    (tmp_path / "zh").mkdir()
    assert notebook_language(default="zh") == "zh"


def test_a_folder_name_alone_decides_nothing(tmp_path, monkeypatch):
    folder = tmp_path / "zh"
    folder.mkdir()
    _nb(folder / "x.ipynb")  # an English notebook in a folder called zh
    monkeypatch.chdir(folder)
    assert notebook_language() == "en"


def test_glance_table_follows_the_notebook(monkeypatch):
    monkeypatch.setenv("TINYTF_LANG", "zh")
    assert "陷阱" in glance_table() and glance_table() == glance_table("zh")
    monkeypatch.setenv("TINYTF_LANG", "en")
    assert glance_table() == glance_table("en") and "pitfall" in glance_table()


def test_edition_folder_follows_the_notebook(monkeypatch, tmp_path):
    (tmp_path / "notebooks" / "zh").mkdir(parents=True)
    (tmp_path / "exercises").mkdir()
    assert edition_folder(tmp_path / "notebooks", "zh") == tmp_path / "notebooks" / "zh"
    assert edition_folder(tmp_path / "notebooks", "en") == tmp_path / "notebooks"
    assert edition_folder(tmp_path / "exercises", "zh") == tmp_path / "exercises", "no zh/ folder: the one there is"
    monkeypatch.setenv("TINYTF_LANG", "zh")
    assert edition_folder(tmp_path / "notebooks") == tmp_path / "notebooks" / "zh", "the running notebook's edition"
    monkeypatch.setenv("TINYTF_LANG", "en")
    assert edition_folder(tmp_path / "notebooks") == tmp_path / "notebooks"
