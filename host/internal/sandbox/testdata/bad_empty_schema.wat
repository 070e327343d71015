;; bad_empty_schema.wat: moe_init declares no inputs or outputs.
(module
  (memory (export "memory") 1)
  (func (export "moe_abi_version") (result i32) (i32.const 1))
  (func (export "moe_init") (result i32) (i32.const 0))
  (func (export "moe_forward") (result i32) (i32.const 0)))
