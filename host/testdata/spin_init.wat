;; spin_init.wat: an expert whose moe_init never returns. The lifecycle
;; tests use it to hold a server's Start in the middle of loading its
;; experts, so that a Shutdown always lands during Start.
(module
  (memory (export "memory") 1)
  (func (export "moe_abi_version") (result i32) (i32.const 1))
  (func (export "moe_init") (result i32)
    (loop $forever (br $forever))
    (i32.const 0))
  (func (export "moe_forward") (result i32) (i32.const 0))
)
