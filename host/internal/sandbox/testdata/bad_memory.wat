;; bad_memory.wat: asks for more memory than the sandbox allows (8 GiB max
;; is impossible for wasm32, 65536 pages = 4 GiB is the limit here).
(module
  (memory (export "memory") 65536)
  (func (export "moe_abi_version") (result i32) (i32.const 1))
  (func (export "moe_init") (result i32) (i32.const 0))
  (func (export "moe_forward") (result i32) (i32.const 0)))
