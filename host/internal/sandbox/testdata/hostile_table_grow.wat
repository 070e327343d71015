;; hostile_table_grow.wat: grows its table by 2^26 elements in moe_init (two
;; filled maximal tables once cost +2 GB per instance). table.grow belongs
;; to reference types, which the sandbox refuses at compile time.
(module
  (table $t 1 funcref)
  (memory (export "memory") 1)
  (func (export "moe_abi_version") (result i32) (i32.const 1))
  (func (export "moe_init") (result i32)
    (drop (table.grow $t (ref.null func) (i32.const 0x4000000)))
    (i32.const 0))
  (func (export "moe_forward") (result i32) (i32.const 0))
)
