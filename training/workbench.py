"""A fine-tune's inputs without the lifecycle around it: for the GPU tests and the GPU benchmark.

A GPU machine that trains needs torch, DeepSpeed, transformers and this package, not the registry, the
orchestrator or the serving stack. ``Workbench`` makes what ``training.finetune.launch.finetune`` takes from a config
file's training sections alone (``data``, ``snapshot``, ``bootstrap``, ``finetune``, ``preference``; the rest of the
file is not read): the chat snapshot the generator makes, a pair snapshot for the preference stage, the bootstrapped
base model, and a wider model of any shape with the same tokenizer (randomly initialised: for throughput, not quality).

    bench = Workbench.from_yaml(Path("configs/tiny.yaml"), root=tmp)
    result = finetune(bench.finetune, bench.chat_snapshot(), bench.base_model(), tmp / "run")
    dpo = DpoSpec(beta=0.1, sft_weight=1.0, reference=inspect_model_folder(result.export_dir))
    finetune(bench.preference.train, bench.pair_snapshot(), dpo.reference, tmp / "dpo", dpo)

Nothing here imports MLflow, Prefect, vLLM or BentoML (tests/gpu/test_bare_imports.py checks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.config import StrictModel, apply_overrides, load_yaml
from core.hashing import sha256_json
from core.home import Home
from training.config import BootstrapConfig, DataConfig, FinetuneConfig, ModelShape, PreferenceConfig, SnapshotConfig
from training.data.dataset import make_snapshot
from training.data.snapshot import PAIRS, Snapshot, build_snapshot
from training.data.synth import write_jsonl
from training.data.synth_pairs import generate_pairs
from training.model.bootstrap import bootstrap, llama_config
from training.model.modelio import ModelFolder, inspect_model_folder

SECTIONS: dict[str, type[StrictModel]] = {
    "data": DataConfig,
    "snapshot": SnapshotConfig,
    "bootstrap": BootstrapConfig,
    "finetune": FinetuneConfig,
    "preference": PreferenceConfig,
}


@dataclass(frozen=True)
class Workbench:
    data: DataConfig
    snapshot: SnapshotConfig
    bootstrap: BootstrapConfig
    finetune: FinetuneConfig
    preference: PreferenceConfig
    home: Home  # where snapshots and models are kept (the layout of $LIFECYCLE_HOME)

    @classmethod
    def from_yaml(cls, path: Path, root: Path, overrides: list[str] | tuple[str, ...] = ()) -> Workbench:
        """The training sections of a config file (``extends`` followed, ``a.b=c`` overrides applied)."""
        raw = apply_overrides(load_yaml(path), overrides)
        sections: dict[str, Any] = {k: model.model_validate(raw.get(k, {})) for k, model in SECTIONS.items()}
        return cls(**sections, home=Home(root))

    def chat_snapshot(self) -> Snapshot:
        return make_snapshot(self.data, self.snapshot, self.home)

    def pair_snapshot(self) -> Snapshot:
        """The generated preference pairs as a pair snapshot (no eval sets are held out: nothing is evaluated)."""
        key = sha256_json({"pairs": self.preference.data.model_dump(mode="json"), "gen": self.data.generator.seed})
        generated = self.home.generated_data / "pairs" / key[:16] / "pairs.jsonl"
        if not generated.is_file():
            write_jsonl(generate_pairs(self.preference.data, self.data.generator, set()), generated)
        limits = self.snapshot.model_copy(update={"on_invalid": self.preference.data.on_invalid})
        return build_snapshot(
            limits, [generated], self.home.preference_snapshots, reports=self.home.reports, kind=PAIRS
        )

    def base_model(self, snapshot: Snapshot | None = None) -> ModelFolder:
        """The bootstrapped base model of the config (pretrained on the chat snapshot; built once)."""
        return bootstrap(self.bootstrap, snapshot or self.chat_snapshot(), self.home.base_models, progress=False)

    def wide_model(self, shape: ModelShape, seed: int = 0) -> ModelFolder:
        """A randomly initialised Llama of ``shape`` with the base model's tokenizer and chat template (built once):
        a model of production size on the project's data, for throughput measurements."""
        import torch
        from transformers import GenerationConfig, LlamaForCausalLM, PreTrainedTokenizerFast

        base = self.base_model()
        out = self.home.base_models / f"wide-{sha256_json({'shape': shape.model_dump(), 'seed': seed})[:16]}"
        if (out / "config.json").is_file():
            return inspect_model_folder(out)
        tok = PreTrainedTokenizerFast.from_pretrained(base.path)
        torch.manual_seed(seed)
        partial = out.with_name(out.name + ".partial")
        LlamaForCausalLM(llama_config(shape, tok)).save_pretrained(partial)
        tok.save_pretrained(partial)
        GenerationConfig.from_pretrained(base.path).save_pretrained(partial)
        partial.rename(out)
        return inspect_model_folder(out)
