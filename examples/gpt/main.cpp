// Trains a GPT (GPT-2's architecture) on the bytes of a text file, or on a SentencePiece-tokenized
// corpus streamed from .npy shards, then continues a prompt.
//
//   gpt --text book.txt --max-steps 2000
//   scripts/prepare-text-corpus.py corpus && gpt --data corpus --max-steps 2000
//   gpt --text book.txt --n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --max-epochs 2
//   gpt --text book.txt --model-config config.json --activation-checkpointing --max-steps 10
//   gpt --text book.txt --max-steps 200 --strategy ddp --devices 2 --precision bf16-mixed
//   gpt --init-from gpt2-folder --no-train --eval-tokens tokens.npy --block-size 512
//   gpt --text book.txt --max-steps 100 --export-hf out   (out: config.json + model.safetensors)
//
// The last tenth of the text validates (val/loss, in nats per byte); a corpus validates on its
// val-*.npy (val/loss in nats per token, val/bpb in bits per byte of text). Every Trainer flag works as
// in fashion_mnist; --help lists them.
#include <iostream>
#include <string>

#include "gpt/byte_text.h"
#include "gpt/eval_tokens.h"
#include "gpt/gpt_module.h"
#include "gpt/hf_weights.h"
#include "volt/cli/cli_config.h"
#include "volt/cli/trainer_flags.h"
#include "volt/core/error.h"

int main(int argc, char** argv) {
  return volt::run_main([&] {
    CLI::App app("Train a GPT on the bytes of a text file with Volt, then continue a prompt.", "gpt");
    gpt::GptModuleOptions options;
    gpt::GptConfig& model = options.model;
    volt::TrainerOptions trainer_options;
    trainer_options.max_epochs = 1;
    volt::TrainerFlagText flag_text;
    volt::add_trainer_flags(app, trainer_options, flag_text);
    // The groups are the config file's sections (LightningCLI's layout).
    app.add_option("--n-layer", model.n_layer, "transformer blocks")->capture_default_str()->group("Model");
    app.add_option("--n-head", model.n_head, "attention heads (must divide --n-embd)")
        ->capture_default_str()
        ->group("Model");
    app.add_option("--n-embd", model.n_embd, "width of the residual stream")->capture_default_str()->group("Model");
    app.add_option(
           "--block-size", model.n_positions,
           "context length: the model's positions and the training window (with --init-from or --model-config: the "
           "window only, at most the config's n_positions)")
        ->capture_default_str()
        ->group("Model");
    app.add_option("--vocab-size", model.vocab_size,
                   "token embedding rows (at least 256 for byte tokens; with --data: the corpus's, rounded up to a "
                   "multiple of 64)")
        ->capture_default_str()
        ->group("Model");
    double dropout = 0.0;
    app.add_option("--dropout", dropout, "embedding, attention and residual dropout")
        ->capture_default_str()
        ->group("Model");
    app.add_flag("--activation-checkpointing", model.activation_checkpointing,
                 "recompute each block in backward instead of keeping its activations (less memory, ~1 more forward)")
        ->group("Model");
    std::string model_config;
    app.add_option("--model-config", model_config,
                   "a Hugging Face GPT-2 config.json giving the model's size and dropouts (instead of the size flags)")
        ->group("Model");
    // Hugging Face weights in and out (docs/gpt.md, "Hugging Face weights in and out").
    std::string init_from, export_hf, eval_tokens;
    bool no_train = false;
    app.add_option("--init-from", init_from,
                   "a Hugging Face GPT-2 folder (config.json + model.safetensors or shards) to start from; its "
                   "config.json sets the model's size")
        ->group("Model");
    app.add_option("--export-hf", export_hf,
                   "after training, write the model as a Hugging Face GPT2LMHeadModel folder (rank 0)")
        ->group("Model");
    app.add_option("--eval-tokens", eval_tokens,
                   "after training, print the loss on a 1-D .npy of token ids cut into --block-size windows")
        ->group("Model");
    app.add_flag("--no-train", no_train,
                 "skip training: load, then continue --prompt if given, --eval-tokens and/or --export-hf")
        ->group("Model");
    app.add_option("--lr", options.lr, "AdamW's peak learning rate")->capture_default_str()->group("Model");
    app.add_option("--min-lr-ratio", options.min_lr_ratio,
                   "the learning rate after the cosine decay, as a share of --lr")
        ->capture_default_str()
        ->group("Model");
    app.add_option("--weight-decay", options.weight_decay, "AdamW's weight decay (matrices and embeddings only)")
        ->capture_default_str()
        ->group("Model");
    app.add_option("--warmup-steps", options.warmup_steps,
                   "optimizer steps of linear warmup (0: a tenth of the decay's)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber)
        ->group("Model");
    app.add_option("--lr-decay-steps", options.lr_decay_steps,
                   "optimizer steps until the cosine decay ends (0: the whole run, as the Trainer counts it)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber)
        ->group("Model");
    app.add_option("--text", options.text, "the text file to train on (read as bytes)")->group("Data");
    app.add_option("--data", options.data,
                   "or: a folder of token shards, tokenizer.model and meta.json from scripts/prepare-text-corpus.py")
        ->group("Data");
    app.add_option("--val-fraction", options.val_fraction, "the share of the text, from its end, that validates")
        ->capture_default_str()
        ->group("Data");
    app.add_option("--batch-size", options.batch_size, "windows per batch")->capture_default_str()->group("Data");
    app.add_option("--num-workers", options.num_workers, "threads that make batches ahead of the step")
        ->capture_default_str()
        ->group("Data");
    app.add_option("--prompt", options.prompt, "the text the sample at the end continues")->capture_default_str();
    app.add_option("--sample-tokens", options.sample.max_new_tokens, "tokens generated at the end (0: no sample)")
        ->capture_default_str();
    app.add_option("--temperature", options.sample.temperature, "sampling temperature (0: greedy)")
        ->capture_default_str();
    app.add_option("--top-k", options.sample.top_k, "sample among the k most likely tokens (0: all)")
        ->capture_default_str();
    app.add_option("--sample-seed", options.sample.seed, "the sample's seed")->capture_default_str();
    bool print_plan = false;
    app.add_flag("--print-plan", print_plan, "print the resolved run plan and exit")->configurable(false);
    if (const std::optional<int> code = volt::parse_command_line(app, argc, argv)) return *code;
    volt::apply_trainer_flags(flag_text, trainer_options);
    trainer_options.config = volt::resolved_config(app);

    // With a config.json, --block-size is the window of training, validation and --eval-tokens,
    // not a size: the model keeps the config's n_positions.
    const int64_t block_size_flag = model.n_positions;
    const bool block_size_given = app.count("--block-size") > 0;
    // What set the model's size when a config.json did, for errors that must not suggest a size flag.
    std::string config_source;
    if (!init_from.empty() || !model_config.empty()) {
      // A config.json sets the size (the folder's with --init-from): a size flag would contradict it.
      const bool folder = !init_from.empty();
      const std::string source = folder ? "--init-from=" + init_from : "--model-config=" + model_config;
      for (const std::string flag :
           {"--model-config", "--n-layer", "--n-head", "--n-embd", "--vocab-size", "--dropout"}) {
        VOLT_CHECK((!folder && flag == "--model-config") || app.count(flag) == 0,
                   "{} and {} were both given. HINT: the config.json sets the model's size; drop {}{}.", source, flag,
                   flag, folder ? "" : " or the config");
      }
      const bool checkpointing = model.activation_checkpointing;
      model = folder ? gpt::load_hf_folder_config(init_from) : gpt::load_hf_config(model_config);
      model.activation_checkpointing = checkpointing;
      config_source = folder ? init_from + "/config.json" : model_config;
      if (block_size_given) options.block_size = block_size_flag;
    } else {
      model.embd_pdrop = model.attn_pdrop = model.resid_pdrop = dropout;
    }
    // full_shard gathers one block at a time (FSDP's per-block wrapping); elsewhere units change nothing.
    model.fsdp_units = trainer_options.sharding_strategy == volt::ShardingStrategy::kFullShard;
    // strategy="pipeline" splits the model's Pipe (embeddings, blocks, head) into stages.
    model.pipelined = trainer_options.strategy == volt::StrategyRequest::kPipeline;
    const int64_t eval_window = block_size_given ? block_size_flag : model.n_positions;
    VOLT_CHECK(eval_tokens.empty() || (eval_window >= 2 && eval_window <= model.n_positions),
               "--block-size={} cannot cut --eval-tokens windows: expected 2..{} (the model's n_positions). HINT: the "
               "windows must fit the model's context.",
               eval_window, model.n_positions);
    const torch::Tensor eval_ids = eval_tokens.empty() ? torch::Tensor() : gpt::read_token_ids(eval_tokens);
    // After training (or instead of it), on rank 0 only.
    const auto evaluate_and_export = [&](gpt::Gpt& gpt_model) {
      if (eval_ids.defined()) {
        const gpt::TokenEvalResult eval = gpt::evaluate_tokens(gpt_model, eval_ids, eval_window);
        std::cout << fmt::format("eval: {} windows of {} tokens from {}, {} predicted tokens\n", eval.windows,
                                 eval_window, eval_tokens, eval.predicted_tokens)
                  << fmt::format("eval loss {:.8f}\n", eval.loss);
      }
      if (!export_hf.empty()) {
        gpt::save_hf_pretrained(gpt_model, export_hf);
        std::cout << "exported the model to " << export_hf << " (config.json, model.safetensors)\n";
      }
    };
    // The tokens: a corpus's tokenizer (--data; also what --no-train's prompt is encoded with) or bytes.
    if (!options.data.empty()) {
      const int64_t pieces = gpt::read_corpus_meta(options.data).vocab_size;
      if (!config_source.empty()) {
        VOLT_CHECK(pieces <= model.vocab_size,
                   "the tokenizer of --data={} has {} pieces, but the model's vocab_size (from {}) is {}: its "
                   "embedding has no row for the ids from {} on. HINT: tokenize the corpus with at most {} pieces "
                   "(scripts/prepare-text-corpus.py --vocab-size {}), or start from a model whose vocab_size is at "
                   "least {}.",
                   options.data, pieces, config_source, model.vocab_size, model.vocab_size, model.vocab_size,
                   model.vocab_size, pieces);
      } else if (app.count("--vocab-size") == 0) {
        // The tokenizer's pieces rounded up to a multiple of 64 (faster matrix multiplications);
        // --vocab-size may give more (checked by the module).
        model.vocab_size = (pieces + 63) / 64 * 64;
      }
    } else if (!options.text.empty() || !no_train) {
      VOLT_CHECK(model.vocab_size >= gpt::kByteVocabSize,
                 "{} is too small for byte tokens (--text), which take {} values. HINT: {}",
                 config_source.empty()
                     ? fmt::format("--vocab-size={}", model.vocab_size)
                     : fmt::format("the model's vocab_size (from {}), {},", config_source, model.vocab_size),
                 gpt::kByteVocabSize,
                 config_source.empty()
                     ? "pass --vocab-size 256 or more."
                     : fmt::format("train it on a corpus tokenized to at most {} pieces (--data; "
                                   "scripts/prepare-text-corpus.py --vocab-size {}), or start from a model whose "
                                   "vocab_size is at least 256.",
                                   model.vocab_size, model.vocab_size));
    }
    // A prompt given with --no-train is continued by the loaded model (no Trainer, one process).
    const bool sample_without_training = no_train && app.count("--prompt") > 0;
    if (no_train) {
      model.fsdp_units = false;  // no fsdp without a Trainer
      // No Trainer, so nothing else applies --num-threads (unset or 0: LibTorch's default).
      if (trainer_options.num_threads.value_or(0) > 0) torch::set_num_threads(*trainer_options.num_threads);
      gpt::GptModule module(options);
      if (!init_from.empty()) gpt::load_hf_weights(module.transformer(), init_from);
      if (sample_without_training && options.sample.max_new_tokens > 0) {
        const torch::Tensor sample =
            gpt::generate(module.transformer(), module.encode(options.prompt).unsqueeze(0), options.sample);
        std::cout << "sample (--prompt continued by " << options.sample.max_new_tokens
                  << (options.data.empty() ? " bytes" : " tokens") << "):\n"
                  << module.decode(sample[0]) << "\n";
      }
      evaluate_and_export(module.transformer());
      return 0;
    }
    // Training needs data: a text file's bytes or a tokenized corpus.
    VOLT_CHECK(options.text.empty() != options.data.empty(),
               "{}. HINT: pass --text FILE to train on a file's bytes, or --data FOLDER to train on a corpus "
               "tokenized by scripts/prepare-text-corpus.py.",
               options.text.empty() ? "neither --text nor --data was given" : "--text and --data were both given");

    const volt::BatchLimit& val_limit = trainer_options.limit_val_batches;
    // Without validation (--val-fraction 0, a text too short to hold out a window,
    // --limit-val-batches 0) there is no val/loss to rank checkpoints by: keep the latest.
    const bool validates = gpt::has_validation_data(options) &&
                           (val_limit.is_fraction() ? val_limit.fraction() > 0 : val_limit.count() > 0);
    if (trainer_options.enable_checkpointing) {
      trainer_options.callbacks.push_back(std::make_shared<volt::ModelCheckpoint>(
          validates ? volt::ModelCheckpointOptions{.filename = "{epoch}-{step}-{val/loss:.4f}",
                                                   .monitor = "val/loss",
                                                   .mode = volt::Mode::kMin,
                                                   .save_last = true}
                    : volt::ModelCheckpointOptions{.filename = "{epoch}-{step}", .save_last = true}));
    }
    volt::Trainer trainer(trainer_options);
    if (print_plan) {
      std::cout << trainer.plan().describe();
      return 0;
    }
    // The Trainer seeded LibTorch (seed_everything), so the initial weights are reproducible.
    gpt::GptModule module(options);
    // Checked against the model now, read by the Trainer once the strategy has placed the
    // parameters: under full_shard each process reads only its pieces of the blocks.
    std::shared_ptr<gpt::HfWeights> hf_weights;
    if (!init_from.empty()) {
      hf_weights = std::make_shared<gpt::HfWeights>(module.transformer(), init_from);
      module.set_initial_weights(hf_weights);
    }
    const volt::FitResult result = trainer.fit(module);
    // Under --max-restarts this process only supervised the workers, which ran the whole program.
    if (result.supervised) {
      trainer.teardown();
      return 0;
    }
    if (hf_weights) {
      // Every process says what it read (none when the fit resumed from a checkpoint).
      std::cout << fmt::format("init-from: process {} read {} of the {} bytes of weights in {}\n",
                               trainer.plan().topology.global_rank, hf_weights->bytes_read(), hf_weights->bytes_total(),
                               init_from);
    }
    // SLURM is about to end this run and start the job again; it resumes from the HPC checkpoint.
    if (result.requeued()) {
      trainer.teardown();
      return 0;
    }
    // Under ddp every process runs this program; only rank 0 reports.
    const bool report = trainer.plan().is_global_zero();
    if (report) std::cout << result.full_report();
    if (result.reason != volt::StopReason::kInterrupted && options.sample.max_new_tokens > 0) {
      const std::vector<torch::Tensor> samples = trainer.predict(module);
      if (report && !samples.empty()) {
        std::cout << "sample (--prompt continued by " << options.sample.max_new_tokens
                  << (options.data.empty() ? " bytes" : " tokens") << "):\n"
                  << module.decode(samples.front()[0]) << "\n";
      }
    }
    if (report) std::cout << result.brief_report() << "\n";
    if (report && result.reason != volt::StopReason::kInterrupted) evaluate_and_export(module.transformer());
    trainer.teardown();
    return result.reason == volt::StopReason::kInterrupted ? 130 : 0;
  });
}
