"""Run with the previous release's code on PYTHONPATH: saves two tiny models, trained briefly to copy sequences reversed, and their translations."""
import json, sys, torch
from pathlib import Path
import vanilla_transformer
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
print("code from", vanilla_transformer.__file__)  # the previous release's src/, through PYTHONPATH
out = Path(sys.argv[1])
sources = torch.tensor([[5, 17, 33, 90, 61, 8, 2], [44, 7, 100, 2, 0, 0, 0], [120, 3, 64, 99, 12, 2, 0]])
mask = (sources != 0).long()
for name, overrides in [("cpu-trained", dict(dropout_implementation="cpu_16bit")),
                        ("attention-bias", dict(attention_bias=True))]:
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset("tiny", **overrides)
    model = VanillaTransformerForConditionalGeneration(config).eval()
    # A few hundred steps of copying reversed sequences, so that its translations are not one token repeated.
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1)
    for step in range(300):
        tokens = torch.randint(4, 128, (32, 6), generator=generator)
        labels = torch.cat([tokens.flip(1), torch.full((32, 1), 2)], 1)
        inputs = torch.cat([tokens, torch.full((32, 1), 2)], 1)
        loss = model(input_ids=inputs, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    print(name, "loss", float(loss))
    model.eval()
    folder = out / name
    model.save_pretrained(folder)
    if name == "attention-bias":  # as saved before the field existed: projections with biases, no field
        config_json = json.loads((folder / "config.json").read_text())
        del config_json["attention_bias"]
        (folder / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
    with torch.no_grad():
        greedy = model.generate(sources, attention_mask=mask, num_beams=1, max_new_tokens=12)
        beam = model.generate(sources, attention_mask=mask, max_new_tokens=12)
    (folder / "expected_translations.json").write_text(json.dumps(dict(
        input_ids=sources.tolist(), greedy=greedy.tolist(), beam_4=beam.tolist()), indent=1) + "\n")
    print(name, sorted(p.name for p in folder.iterdir()), greedy.tolist()[0], beam.tolist()[0])
