;; bad_init_trap.wat: traps in moe_init.
(module
  (memory (export "memory") 1)
  (func (export "moe_abi_version") (result i32) (i32.const 1))
  (func (export "moe_init") (result i32) unreachable)
  (func (export "moe_forward") (result i32) (i32.const 0)))
