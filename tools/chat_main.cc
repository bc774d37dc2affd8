// l2l-chat (`l2l chat`): an interactive chat with a model, in its own chat template.
//   l2l-chat MODEL [--tokenizer PATH] [--template NAME] [--system TEXT] [--max-tokens N]
//            [--context N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--ids]
// MODEL: as l2l-sample (HF dir, GGUF, checkpoint, l2l safetensors; tools/inference_model.h),
// on the CPU. Each line read from stdin (a terminal or a pipe) is a user turn; the reply
// streams to stdout and ends at the template's end-of-turn token (or the tokenizer's EOS,
// or --max-tokens). `/exit` (or end of input) ends the chat, `/reset` starts it again.
// --context: the most tokens a conversation may hold (default the model's seq_len, at most
// 4096), which sizes the key/value cache; a turn that would not fit is refused (/reset).
//
// The template (tokenizer/chat_template.h): --template NAME, else the model's own Jinja
// template (GGUF tokenizer.chat_template or tokenizer_config.json's chat_template, read from
// the tokenizer's path, then the model's) recognised by its markers, else ChatML when the
// tokenizer has <|im_start|> and <|im_end|>. Every turn renders the whole conversation and
// encodes it without added specials (as apply_chat_template(..., tokenize=True) does);
// the key/value cache (kernels/layers/kv_decode.h) keeps what the previous turns computed
// when the new ids extend the cached ones, so a turn costs its new tokens only.
// --temperature 0 is greedy: a reply's ids are then those l2l-sample --prompt-ids (the
// turn's prompt ids) --temperature 0 generates. --ids prints each turn's prompt ids and
// reply ids ("prompt ids: ..." / "reply ids: ...") after the reply.
// main() only parses flags, builds objects and runs (STYLE.md).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/logging.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/load.h"
#include "tools/inference_model.h"
#include "worker/reference/reference_trainer.h"
#include "worker/sampler.h"

namespace {

namespace t = l2l::tools;
namespace w = l2l::worker;
using l2l::tok::ChatMessage;
using l2l::tok::ChatTemplate;

struct Flags {
  std::string model, tokenizer, template_name, system;
  int64_t max_tokens = 512, top_k = 40, context = 0;
  float temperature = 0.7f, top_p = 0.9f;
  uint64_t seed = 1;
  bool ids = false;
};

std::string JoinIds(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
  return s;
}

// --template, else the model's own, else ChatML or Gemma's when the tokenizer has their tokens.
l2l::Result<ChatTemplate> PickTemplate(const Flags& f, const std::vector<std::string>& paths,
                                       const l2l::tok::Tokenizer& tok) {
  if (!f.template_name.empty()) return ChatTemplate::ByName(f.template_name);
  for (const std::string& p : paths) {
    if (p.empty()) continue;
    L2L_ASSIGN_OR_RETURN(std::string jinja, l2l::tok::LoadChatTemplateSource(p));
    if (!jinja.empty()) return ChatTemplate::FromJinja(jinja);
  }
  if (tok.TokenId("<|im_start|>") && tok.TokenId("<|im_end|>")) {
    std::fprintf(stderr, "l2l-chat: the model has no chat template; using chatml (its tokenizer has <|im_start|>)\n");
    return ChatTemplate::ByName("chatml");
  }
  if (tok.TokenId("<start_of_turn>") && tok.TokenId("<end_of_turn>")) {
    std::fprintf(stderr, "l2l-chat: the model has no chat template; using gemma (its tokenizer has <start_of_turn>)\n");
    return ChatTemplate::ByName("gemma");
  }
  return l2l::FailedPrecondition(
      "the model has no chat template and its tokenizer is neither ChatML's nor Gemma's; pass --template");
}

// One reply to `prompt`: streams its text to stdout; returns its ids (the stop token last,
// when it came).
l2l::Result<std::vector<int32_t>> Reply(const w::NextTokenProbs& next, const l2l::tok::Tokenizer& tok,
                                        const std::vector<int32_t>& prompt, const Flags& f, int64_t seq_len,
                                        const std::vector<int32_t>& stops, uint64_t seed) {
  std::vector<int32_t> context = prompt, reply;
  size_t printed = 0;
  for (int64_t i = 0; i < f.max_tokens && static_cast<int64_t>(context.size()) < seq_len; ++i) {
    L2L_ASSIGN_OR_RETURN(std::vector<float> probs, next(context));
    const int32_t id = w::SampleToken(probs, f.temperature, f.top_k, f.top_p,
                                      w::SamplerUniform(seed, static_cast<uint64_t>(i)));
    reply.push_back(id);
    if (std::find(stops.begin(), stops.end(), id) != stops.end()) break;
    context.push_back(id);
    L2L_ASSIGN_OR_RETURN(std::string text, tok.Decode(reply));
    if (text.size() > printed) {
      std::fwrite(text.data() + printed, 1, text.size() - printed, stdout);
      std::fflush(stdout);
      printed = text.size();
    }
  }
  std::printf("\n");
  return reply;
}

l2l::Status Run(const Flags& f) {
  L2L_ASSIGN_OR_RETURN(t::InferenceModel m, t::LoadInferenceModel(f.model));
  const std::string tok_path = !f.tokenizer.empty() ? f.tokenizer : m.tokenizer_path;
  if (tok_path.empty()) {
    return l2l::InvalidArgument(t::DescribeModel(m) + " has no tokenizer; pass --tokenizer PATH");
  }
  L2L_ASSIGN_OR_RETURN(l2l::tok::Tokenizer tok, l2l::tok::LoadTokenizer(tok_path));
  if (tok.vocab_size() > m.spec.vocab_size) {
    return l2l::InvalidArgument("tokenizer " + tok_path + " has " + std::to_string(tok.vocab_size()) +
                                " ids, more than the model's vocabulary " + std::to_string(m.spec.vocab_size));
  }
  L2L_ASSIGN_OR_RETURN(ChatTemplate tmpl, PickTemplate(f, {tok_path, m.path}, tok));
  const std::optional<int32_t> eot = tok.TokenId(tmpl.end_of_turn());
  if (!eot) {
    return l2l::InvalidArgument("the tokenizer has no " + tmpl.end_of_turn() + " token (the template's end of turn)");
  }
  std::vector<int32_t> stops = {*eot};
  if (tok.eos_id() >= 0 && tok.eos_id() != *eot) stops.push_back(tok.eos_id());
  const std::string desc = t::DescribeModel(m);
  L2L_ASSIGN_OR_RETURN(std::unique_ptr<w::ReferenceTrainer> model, t::CreateInferenceTrainer(&m));
  const int64_t seq_len =
      f.context > 0 ? std::min(f.context, model->spec().seq_len) : std::min<int64_t>(model->spec().seq_len, 4096);
  L2L_ASSIGN_OR_RETURN(w::NextTokenProbs next, w::KvCacheProbs(model.get(), seq_len));
  const bool tty = isatty(STDIN_FILENO) != 0;
  std::fprintf(stderr, "l2l-chat: %s, template %s%s; context %lld tokens; /exit ends, /reset starts again\n",
               desc.c_str(), tmpl.name().c_str(), tmpl.default_system().empty() ? "" : " (with its system prompt)",
               static_cast<long long>(seq_len));

  std::vector<ChatMessage> messages;
  if (!f.system.empty()) messages.push_back({"system", f.system});
  const size_t base = messages.size();
  std::string line;
  for (uint64_t turn = 0;; ++turn) {
    if (tty) std::printf("> "), std::fflush(stdout);
    if (!std::getline(std::cin, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      messages.resize(base);
      std::printf("(the conversation starts again)\n");
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({"user", line});
    L2L_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, tok.Encode(tmpl.Render(messages, true), /*add_special=*/false));
    if (static_cast<int64_t>(prompt.size()) >= seq_len) {
      messages.pop_back();
      std::fprintf(stderr, "l2l-chat: the conversation would take %zu tokens, the model's context is %lld: /reset\n",
                   prompt.size(), static_cast<long long>(seq_len));
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    L2L_ASSIGN_OR_RETURN(std::vector<int32_t> reply, Reply(next, tok, prompt, f, seq_len, stops, f.seed + turn));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const bool stopped = !reply.empty() && std::find(stops.begin(), stops.end(), reply.back()) != stops.end();
    L2L_ASSIGN_OR_RETURN(std::string text,
                         tok.Decode(std::vector<int32_t>(reply.begin(), reply.end() - (stopped ? 1 : 0))));
    messages.push_back({"assistant", text});
    if (f.ids) {
      std::printf("prompt ids: %s\nreply ids: %s\n", JoinIds(prompt).c_str(), JoinIds(reply).c_str());
    }
    std::fflush(stdout);
    if (tty) {
      std::fprintf(stderr, "(%zu tokens in %.1f s%s)\n", reply.size(), secs,
                   stopped ? "" : ", not ended by the model: --max-tokens or the context");
    }
  }
  return l2l::Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"l2l-chat: chat with a model in its chat template (HF dir, GGUF, checkpoint) on the CPU"};
  Flags f;
  app.add_option("model", f.model, "Hugging Face dir, GGUF file, checkpoint dir/root or l2l safetensors")
      ->required();
  app.add_option("--tokenizer", f.tokenizer, "model dir, tokenizer.json or GGUF (default: the model's own)");
  app.add_option("--template", f.template_name, "chat template by name (default: the model's own)");
  app.add_option("--system", f.system, "a system message to start the conversation with");
  app.add_option("--max-tokens", f.max_tokens, "most tokens per reply")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  app.add_option("--context", f.context, "most tokens of a conversation (0: the model's, at most 4096)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--temperature", f.temperature, "<= 0: greedy")->capture_default_str();
  app.add_option("--top-k", f.top_k, "<= 0: no cut")->capture_default_str();
  app.add_option("--top-p", f.top_p, "nucleus mass in (0, 1); >= 1: no cut")->capture_default_str();
  app.add_option("--seed", f.seed, "sampling seed (turn k uses seed + k)")->capture_default_str();
  app.add_flag("--ids", f.ids, "after each reply, print the turn's prompt ids and reply ids");
  app.add_flag_callback("--help-env", l2l::PrintEnvHelpAndExit, l2l::kHelpEnvDoc);
  CLI11_PARSE(app, argc, argv);
  l2l::InitLogging("warn").IgnoreError();
  l2l::Status s = Run(f);
  if (!s.ok()) {
    std::fprintf(stderr, "l2l-chat: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
