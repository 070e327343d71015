;; bad_host_func.wat: imports a function that moehost_v1 does not have.
(module
  (import "moehost_v1" "launch_missiles" (func $nope (result i32)))
  (memory (export "memory") 1)
  (func (export "moe_abi_version") (result i32) (i32.const 1))
  (func (export "moe_init") (result i32) (i32.const 0))
  (func (export "moe_forward") (result i32) (i32.const 0)))
