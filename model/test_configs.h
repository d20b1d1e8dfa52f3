// Small training configurations the model tests share.
#ifndef TANDEM_MODEL_TEST_CONFIGS_H_
#define TANDEM_MODEL_TEST_CONFIGS_H_

#include "model/trainer.h"

namespace tandem {

// A 2-layer `preset` ("gpt" or "mlp") of width d_model (n_head heads in a GPT), sequence
// seq_len and vocabulary vocab: small enough for tests that run every block.
inline ModelConfig TwoLayerModel(const char* preset, int d_model, int n_head, int seq_len,
                                 int vocab) {
  ModelConfig c = *ModelPreset(preset);
  c.n_layer = 2;
  c.d_model = d_model;
  c.n_head = n_head;
  c.seq_len = seq_len;
  c.vocab = vocab;
  return c;
}

// A 2-layer GPT (d_model 32, 2 heads, seq 16: 4 blocks, embed, h0, h1, head), batch 4 in 2
// micro-batches, 6 AdamW steps with warmup and weight decay, seed 11: for checkpoint, resume
// and resharding tests, where every part of the training state must come back.
inline TrainConfig ResumableConfig() {
  TrainConfig c;
  c.model = *ModelPreset("gpt");
  c.model.n_layer = 2;
  c.model.d_model = 32;
  c.model.n_head = 2;
  c.model.seq_len = 16;
  c.batch = 4;
  c.micro_batches = 2;
  c.steps = 6;
  c.optimizer.lr = 3e-3f;
  c.optimizer.warmup_steps = 2;
  c.optimizer.total_steps = 6;
  c.optimizer.weight_decay = 0.1f;
  c.seed = 11;
  return c;
}

// A 2-layer GPT (d_model 64, 4 heads, seq 32), batch 8, `steps` AdamW steps at lr 3e-3 after
// 5 warmup steps: enough to see the loss fall on the default corpus within seconds.
inline TrainConfig LearningConfig(int steps) {
  TrainConfig c;
  c.model = *ModelPreset("gpt");
  c.model.n_layer = 2;
  c.model.d_model = 64;
  c.model.n_head = 4;
  c.model.seq_len = 32;
  c.batch = 8;
  c.steps = steps;
  c.optimizer.lr = 3e-3f;
  c.optimizer.warmup_steps = 5;
  c.optimizer.total_steps = steps;
  return c;
}

}  // namespace tandem

#endif  // TANDEM_MODEL_TEST_CONFIGS_H_
