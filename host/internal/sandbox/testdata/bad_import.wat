;; bad_import.wat: imports a function from "env", which the sandbox refuses.
(module
  (import "env" "abort" (func $abort (param i32)))
  (memory (export "memory") 1)
  (func (export "moe_abi_version") (result i32) (i32.const 1))
  (func (export "moe_init") (result i32) (i32.const 0))
  (func (export "moe_forward") (result i32) (i32.const 0)))
