;; hostile_wasi.wat: imports WASI's path_open, which no committed guest
;; needs.
(module
  (import "wasi_snapshot_preview1" "path_open" (func (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "moe_abi_version") (result i32) (i32.const 1))
  (func (export "moe_init") (result i32) (i32.const 0))
  (func (export "moe_forward") (result i32) (i32.const 0))
)
