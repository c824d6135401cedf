"""The recipe's natural-English corpus: pinned registry artifacts (`sources`) fetched and
checked (`fetch`), read into documents (`readers`, `extract`, `rdata`) and split into train and
held out (`build`, the command). SOURCES.md says what each source is and its license."""
