"""Fully sharded data parallel on two CPU processes over gloo, started under `torchrun --standalone --nproc_per_node 2`
by the test. Three Adam steps on a global batch split between the processes end with the weights of one process
training on the whole batch, and the embedding matrix, which is also both stacks' `embed_tokens` and the `lm_head`
(section 3.4), stays one tensor:

- FSDP2 (`torch.distributed.fsdp.fully_shard`): each encoder and decoder layer a unit, then the root unit, which holds
  the embedding under all its names (a parameter may belong to one unit only). The gathered full state dict saves a
  folder that `from_pretrained` loads with the same weights.
- FSDP1 with the wrapping of `examples/accelerate/fsdp.yaml` (the layer classes it names, `use_orig_params`).
"""

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.model.modeling_vanilla_transformer import shift_tokens_right


pytestmark = pytest.mark.slow  # two processes under torchrun

if not hasattr(pytest.importorskip("torch.distributed.fsdp"), "fully_shard"):  # public from torch 2.6
    pytest.skip("this torch has no torch.distributed.fsdp.fully_shard (FSDP2)", allow_module_level=True)

ACCELERATE_FSDP = Path(__file__).resolve().parents[1] / "examples" / "accelerate" / "fsdp.yaml"
STEPS = 3
ADAM = dict(lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
TIED = ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
        "lm_head.weight")


def build_model() -> VanillaTransformerForConditionalGeneration:
    """The tiny preset in float32 with every dropout off, the same initial weights in every process."""
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset(
        "tiny", vocab_size=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0
    )
    return VanillaTransformerForConditionalGeneration(config)


def global_batch() -> dict[str, torch.Tensor]:
    """Four padded pairs; process r of 2 takes rows 2r and 2r + 1."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(4, 64, (4, 7), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    labels = torch.randint(4, 64, (4, 6), generator=generator)
    for row, (source_length, target_length) in enumerate([(7, 6), (4, 3), (6, 5), (5, 6)]):
        input_ids[row, source_length:], attention_mask[row, source_length:] = 0, 0
        labels[row, target_length:] = -100
    decoder_input_ids = shift_tokens_right(labels, pad_token_id=0, decoder_start_token_id=1)  # the tiny preset's ids
    return dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids, labels=labels)


def train(model, batch: dict[str, torch.Tensor], tokens: int, scale: float = 1.0) -> list[torch.Tensor]:
    """`STEPS` Adam steps on `scale` x (the cross-entropy summed over `batch`'s target tokens / `tokens`); the
    unscaled losses."""
    optimizer = torch.optim.Adam(model.parameters(), **ADAM)
    losses = []
    for _ in range(STEPS):
        inputs = {name: batch[name] for name in ("input_ids", "attention_mask", "decoder_input_ids")}
        logits = model(**inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), reduction="sum")
        loss = loss / tokens
        (scale * loss).backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return losses


def shard_fsdp2(model):
    from torch.distributed.fsdp import fully_shard

    units = [*model.model.encoder.layers, *model.model.decoder.layers]
    for layer in units:
        fully_shard(layer)
    fully_shard(model)  # the root unit: the embedding under its four names, nothing else
    for unit in [*units, model]:
        # Gradients averaged over the processes by sum collectives and a division, whatever average the backend
        # has (torch 2.13 averages over gloo without this too).
        unit.set_force_sum_reduction_for_comms(True)
    return model


def shard_fsdp1_as_accelerate_config(model):
    """torch's FSDP1 wrapping as accelerate builds it from `fsdp.yaml`: its layer classes, `use_orig_params`."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    config = yaml.safe_load(ACCELERATE_FSDP.read_text())["fsdp_config"]
    assert (config["fsdp_version"], config["fsdp_auto_wrap_policy"]) == (1, "TRANSFORMER_BASED_WRAP")
    layer_classes = {type(module) for module in model.modules()
                     if type(module).__name__ in config["fsdp_transformer_layer_cls_to_wrap"].split(",")}
    assert len(layer_classes) == 2
    policy = partial(transformer_auto_wrap_policy, transformer_layer_cls=layer_classes)
    return FullyShardedDataParallel(model, auto_wrap_policy=policy, use_orig_params=config["fsdp_use_orig_params"],
                                    device_id=torch.device("cpu"))


def sharded_run(output: Path) -> None:
    """One of two processes: for each FSDP version, shard, train on this process's half of the global batch, gather
    the full state dict; process 0 writes what the test compares."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    batch = global_batch()
    tokens = int((batch["labels"] != -100).sum())
    mine = {name: tensor[2 * rank: 2 * rank + 2] for name, tensor in batch.items()}
    report = {}
    for version, shard in [("fsdp2", shard_fsdp2), ("fsdp1", shard_fsdp1_as_accelerate_config)]:
        model = shard(build_model())
        inner = getattr(model, "module", model)
        tied = (inner.lm_head.weight is inner.model.shared.weight is inner.model.encoder.embed_tokens.weight
                is inner.model.decoder.embed_tokens.weight)
        # Averaged gradients: each process's share of the global mean loss, times the number of processes.
        losses = train(model, mine, tokens, scale=world_size)
        for loss in losses:
            dist.all_reduce(loss)
        # FSDP1 on a CPU crashes copying full tensors to the CPU (offload_to_cpu) they are already on.
        offload = version == "fsdp2"
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=offload))
        if rank == 0:
            torch.save(full, output / f"{version}.pt")
            report[version] = dict(losses=[float(loss) for loss in losses], tied=tied)
        if rank == 0 and version == "fsdp2":
            report["fsdp2_shard_shape"] = list(model.lm_head.weight.to_local().shape)
            # Gathered, the matrix is a separate tensor under each of its names; one tensor under all of them is what
            # `save_pretrained` recognises as tied and stores once.
            model.save_pretrained(output / "saved", state_dict={**full, **{name: full[TIED[0]] for name in TIED}})
    if rank == 0:
        (output / "report.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


def test_fsdp_on_two_processes_ends_with_the_weights_of_one_process_on_the_global_batch(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__,
               str(tmp_path)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-5000:]
    report = json.loads((tmp_path / "report.json").read_text())

    single = build_model()
    batch = global_batch()
    losses = [float(loss) for loss in train(single, batch, tokens=int((batch["labels"] != -100).sum()))]
    expected = single.state_dict()
    initial = build_model().state_dict()
    assert all(not torch.equal(tensor, initial[name]) for name, tensor in expected.items())  # every weight trained
    for version in ("fsdp2", "fsdp1"):
        assert report[version]["tied"], version
        assert report[version]["losses"] == pytest.approx(losses, abs=1e-6), version
        full = torch.load(tmp_path / f"{version}.pt")
        assert full.keys() == expected.keys(), version
        for name in TIED[1:]:
            torch.testing.assert_close(full[name], full[TIED[0]], rtol=0, atol=0, msg=f"{version}: {name}")
        for name, tensor in expected.items():
            torch.testing.assert_close(full[name], tensor, rtol=0, atol=1e-6, msg=f"{version}: {name}")
    # FSDP2 sharded the embedding matrix: each process held half of its rows.
    assert report["fsdp2_shard_shape"] == [single.config.vocab_size // 2, single.config.d_model]

    saved = tmp_path / "saved"
    assert json.loads((saved / "config.json").read_text())["architectures"] == [type(single).__name__]
    assert set(load_file(saved / "model.safetensors")) & set(TIED) == {TIED[0]}  # the matrix stored once
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(saved)
    assert loaded.lm_head.weight is loaded.model.shared.weight is loaded.model.decoder.embed_tokens.weight
    for name, tensor in loaded.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-6, msg=name)


if __name__ == "__main__":
    sharded_run(Path(sys.argv[1]))
