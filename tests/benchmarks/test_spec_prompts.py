"""benchmarks.spec_prompts: the long-document prompts are 4K-8K tokens, as the issue's benchmark asks."""

from benchmarks.spec_prompts import LONG_DOC_QUESTION, build_prompts, long_doc_tokens, long_document


def test_long_documents_span_4k_to_8k_tokens_and_fit_the_context(loaded_model):
    tok = loaded_model.tokenizer
    assert [long_doc_tokens(i) for i in range(8)] == [4096, 5632, 7168, 4608, 6144, 7680, 5120, 6656]
    docs = [long_document(tok, i) for i in range(4)]
    assert len(set(docs)) == 4
    assert all(doc.startswith("# file: ") for doc in docs)
    # the cut is made in tokens: re-encoding the text gives the length back, within a few merges
    for i, doc in enumerate(docs):
        assert abs(len(tok.encode(doc)) - long_doc_tokens(i)) <= 8, i
    prompts = build_prompts(tok, "long_doc_qa", 8)
    context = loaded_model.config.max_position_embeddings
    for i, prompt in enumerate(prompts):
        assert long_doc_tokens(i) < len(prompt) < long_doc_tokens(i) + 64, i  # the template and the question
        assert len(prompt) + 64 <= context  # the benchmark's 64 output tokens fit
    assert tok.decode(prompts[0]).count(LONG_DOC_QUESTION.strip()) == 1
