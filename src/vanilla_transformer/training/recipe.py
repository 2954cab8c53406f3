"""The paper's training recipe as plain values, without importing torch or transformers (the `train` command's
`--help` reads them): sections 5.3-5.4 as `Seq2SeqTrainingArguments` fields, and the names of the CPU speed-ups."""

# Sections 5.3-5.4 as `Seq2SeqTrainingArguments` fields. Residual dropout (P_drop = 0.1) lives in the model config.
# The paper clips no gradients (`max_grad_norm=0`) and Adam has no weight decay. Not the paper's: the logged loss keeps
# a NaN or infinite step's loss instead of replacing it (`logging_nan_inf_filter`), since testing each step's loss
# makes every step wait for the device.
PAPER_RECIPE = dict(
    lr_scheduler_type="inverse_sqrt",
    warmup_steps=4000,
    optim="adamw_torch_fused",
    adam_beta1=0.9,
    adam_beta2=0.98,
    adam_epsilon=1e-9,
    weight_decay=0.0,
    max_grad_norm=0.0,
    label_smoothing_factor=0.1,
    predict_with_generate=True,
    logging_nan_inf_filter=False,
)

# The CPU speed-ups of cpu_speedups.py, by the names --cpu-speedups takes.
CPU_SPEEDUPS = ("dropout16", "keep_memory", "chunked_loss", "bf16_logits")
