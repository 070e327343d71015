;; bad_no_forward.wat: lacks the moe_forward export.
(module
  (memory (export "memory") 1)
  (func (export "moe_abi_version") (result i32) (i32.const 1))
  (func (export "moe_init") (result i32) (i32.const 0)))
