;; bad_command.wat: a WASI command, as Go builds an expert without
;; -buildmode=c-shared: it exports _start, not _initialize, and its exports
;; trap when called before _start.
(module
  (memory (export "memory") 1)
  (func (export "_start"))
  (func (export "moe_abi_version") (result i32) (unreachable))
  (func (export "moe_init") (result i32) (i32.const 0))
  (func (export "moe_forward") (result i32) (i32.const 0)))
