# l2l-eval and l2l-sample against Hugging Face transformers (label "unit;oracle"; included
# from tests/CMakeLists.txt inside l2l_add_test_module, so CMAKE_CURRENT_SOURCE_DIR is
# tests/). tools.hf_oracle: a random LlamaForCausalLM saved by transformers with a
# byte-level BPE tokenizer trained here: eval loss (with and without a loss mask) rel <=
# 1e-5, greedy ids for 32 tokens equal generate's, bad inputs refused in one line.
# tools.smollm2: the real SmolLM2-135M GGUF (scripts/fetch_models.sh; a failed fetch fails
# the test): perplexity on 512 tokens of GPL-3 vs transformers' GGUF loader rel <= 1e-3,
# greedy ids for 16 tokens equal. The interpreter comes from scripts/oracle_venv.sh: a
# missing venv fails.
l2l_add_oracle_test(tools.hf_oracle SCRIPT tools/tools_oracle.py WORKDIR tools_oracle
                    ARGS "'$<TARGET_FILE_DIR:l2l-eval>'" @WORKDIR@ synthetic
                    LABELS unit oracle TIMEOUT 600)
l2l_add_oracle_test(tools.smollm2 SCRIPT tools/tools_oracle.py FETCH smollm2 WORKDIR tools_smollm2
                    ARGS "'$<TARGET_FILE_DIR:l2l-eval>'" @WORKDIR@ smollm2 @MODEL@
                    LABELS integration oracle TIMEOUT 1200)
# tools.encoder_oracle: l2l-eval on random BertForSequenceClassification (2 and 3 labels)
# and BertForMaskedLM models saved by transformers: loss, accuracy, F1 and the masked-LM
# metrics against HF's logits (tests/tools/encoder_oracle.py). tools.minilm: the real
# all-MiniLM-L6-v2 (scripts/fetch_models.sh minilm; a failed fetch fails the test, it never
# skips): l2l-tokenize rows equal HF's tokenizer and l2l-embed's mean-pooled embeddings equal
# HF AutoModel's (rel <= 1e-5) on 100 sentences, with and without the "bert." prefix.
l2l_add_oracle_test(tools.encoder_oracle SCRIPT tools/encoder_oracle.py WORKDIR encoder_oracle
                    ARGS "'$<TARGET_FILE_DIR:l2l-eval>'" @WORKDIR@ eval
                    LABELS unit oracle TIMEOUT 600)
l2l_add_oracle_test(tools.minilm SCRIPT tools/encoder_oracle.py FETCH minilm WORKDIR encoder_minilm
                    ARGS "'$<TARGET_FILE_DIR:l2l-eval>'" @WORKDIR@ minilm @MODEL@
                    LABELS integration oracle TIMEOUT 1200)
# tools.bert_finetune: scripts/finetune_bert_demo.sh, shortened to 30 relay steps: the real
# all-MiniLM-L6-v2 fine-tuned as a 4-class licence classifier through l2l-eps + one CPU
# worker must end at least 0.2 above the majority class on held-out chunks, and its HF
# export must load in transformers with l2l-eval's logits. Several minutes on 2 cores.
add_test(NAME tools.bert_finetune
         COMMAND bash -c
                 "set -e; rm -rf '${CMAKE_CURRENT_BINARY_DIR}/bert_finetune'; BERT_DEMO_STEPS=30 BERT_DEMO_OUT='${CMAKE_CURRENT_BINARY_DIR}/bert_finetune' L2L_BUILD_DIR='${CMAKE_BINARY_DIR}' bash '${CMAKE_SOURCE_DIR}/scripts/finetune_bert_demo.sh'")
set_tests_properties(tools.bert_finetune PROPERTIES LABELS "integration;oracle" TIMEOUT 1800)
# tools.adapter: l2l-eval / l2l-sample --adapter DIR (a PEFT LoRA adapter saved by peft
# 0.13.2 itself on tiny random Llama and GPT-2 models) against peft's merge_and_unload
# saved as a Hugging Face dir: loss rel <= 1e-5 (against l2l-eval of the merged dir and
# transformers on it), equal greedy ids, mismatched adapters refused naming the module.
l2l_add_oracle_test(tools.adapter SCRIPT tools/adapter_oracle.py WORKDIR tools_adapter
                    ARGS "'$<TARGET_FILE_DIR:l2l-eval>'" @WORKDIR@
                    LABELS unit oracle TIMEOUT 600)
# tools.chat_oracle: `l2l chat` on a random LlamaForCausalLM with a ChatML tokenizer trained
# here and SmolLM2's chat template: a piped two-turn conversation's prompt ids equal
# transformers' apply_chat_template, each greedy reply equals l2l-sample's on the same
# prompt ids, --system and /reset work, an unknown --template is named (tests/tools/chat_oracle.py).
l2l_add_oracle_test(tools.chat_oracle SCRIPT tools/chat_oracle.py WORKDIR chat_oracle
                    ARGS "'$<TARGET_FILE_DIR:l2l>'" @WORKDIR@
                    LABELS unit oracle TIMEOUT 600)
