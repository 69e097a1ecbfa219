"""Facts as data read from released code (FlashInfer releases, arch rules, GPUs, servers), with the versions they were verified against."""
