"""A tiny run of one of the transformers trainers under ``TetoCallback``, with or without ``peft``, for
tests/integration/test_stack_callbacks.py: ``python trainers_script.py KIND PEFT MAX_STEPS SAVE_STEPS STEP_SECONDS``
(KIND: trainer, seq2seq or sft; PEFT: peft or plain). Random weights from tiny configs; nothing is downloaded."""

from __future__ import annotations

import sys
import time

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Seq2SeqTrainer,
                          Seq2SeqTrainingArguments, T5Config, T5ForConditionalGeneration, Trainer, TrainerCallback,
                          TrainingArguments)

from teto.integrations.transformers import TetoCallback, resume_from_checkpoint

kind, use_peft = sys.argv[1], sys.argv[2] == "peft"
max_steps, save_steps, step_seconds = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
VOCAB = 64


class Slow(TrainerCallback):
    def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
        time.sleep(step_seconds)


class Rows(torch.utils.data.Dataset):
    def __init__(self, seq2seq: bool) -> None:
        g = torch.Generator().manual_seed(0)
        self.rows = [torch.randint(3, VOCAB, (16,), generator=g) for _ in range(32)]
        self.seq2seq = seq2seq

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.rows[i]
        labels = ids.flip(0) if self.seq2seq else ids.clone()
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        pad_token_id=0, bos_token_id=1, eos_token_id=2))


def lora(model: torch.nn.Module, modules: list[str], task: str) -> torch.nn.Module:
    if not use_peft:
        return model
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=modules, task_type=task))


def tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(VOCAB - 4)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


common = dict(output_dir="out", max_steps=max_steps, save_steps=save_steps, save_strategy="steps", logging_steps=1,
              per_device_train_batch_size=4, learning_rate=1e-3, report_to=[], use_cpu=True, disable_tqdm=True,
              seed=0)
callbacks = [Slow(), TetoCallback()]
if kind == "trainer":
    trainer = Trainer(model=lora(llama(), ["q_proj", "v_proj"], "CAUSAL_LM"), args=TrainingArguments(**common),
                      train_dataset=Rows(False), callbacks=callbacks)
elif kind == "seq2seq":
    torch.manual_seed(0)
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=VOCAB, d_model=32, d_ff=64, d_kv=8, num_layers=1,
                                             num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=2))
    trainer = Seq2SeqTrainer(model=lora(t5, ["q", "v"], "SEQ_2_SEQ_LM"), args=Seq2SeqTrainingArguments(**common),
                             train_dataset=Rows(True), callbacks=callbacks)
elif kind == "sft":
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    g = torch.Generator().manual_seed(0)
    text = [" ".join(f"w{int(i)}" for i in torch.randint(0, VOCAB - 4, (12,), generator=g)) for _ in range(32)]
    peft_config = None
    if use_peft:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=llama(), args=SFTConfig(**common, max_length=32), train_dataset=Dataset.from_dict(
        {"text": text}), processing_class=tokenizer(), peft_config=peft_config, callbacks=callbacks)
else:
    raise SystemExit(f"unknown trainer {kind}")
trainer.train(resume_from_checkpoint=resume_from_checkpoint())
print(f"trained to step {trainer.state.global_step}", flush=True)
