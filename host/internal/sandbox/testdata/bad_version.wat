;; bad_version.wat: claims ABI version 2, which this host does not serve.
(module
  (memory (export "memory") 1)
  (func (export "moe_abi_version") (result i32) (i32.const 2))
  (func (export "moe_init") (result i32) (i32.const 0))
  (func (export "moe_forward") (result i32) (i32.const 0)))
