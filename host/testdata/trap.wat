;; trap.wat: an identity expert on x:float32[-1,4] that misbehaves on
;; request: when the first element of its input is below -100 it loops
;; forever, and when it is otherwise negative it traps with `unreachable`.
;; The host tests use it to check that a trap or a timeout fails only its
;; own batch and that the instance is replaced.
(module
  (import "moehost_v1" "declare_input" (func $declare_input (param i32 i32 i32 i32 i32) (result i32)))
  (import "moehost_v1" "declare_output" (func $declare_output (param i32 i32 i32 i32 i32) (result i32)))
  (import "moehost_v1" "input" (func $input (param i32) (result i32)))
  (import "moehost_v1" "output" (func $output (param i32 i32) (result i32)))
  (import "moehost_v1" "tensor_read" (func $tensor_read (param i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  ;; 0: "x", 8: "y", 16: shape [-1, 4] as two i64s.
  (data (i32.const 0) "x")
  (data (i32.const 8) "y")
  (data (i32.const 16) "\ff\ff\ff\ff\ff\ff\ff\ff\04\00\00\00\00\00\00\00")
  (func (export "moe_abi_version") (result i32) (i32.const 1))
  (func (export "moe_init") (result i32)
    (drop (call $declare_input (i32.const 0) (i32.const 1) (i32.const 1) (i32.const 16) (i32.const 2)))
    (call $declare_output (i32.const 8) (i32.const 1) (i32.const 1) (i32.const 16) (i32.const 2)))
  (func (export "moe_forward") (result i32)
    (local $x i32)
    (local.set $x (call $input (i32.const 0)))
    ;; Read the batch into memory at 1024 (up to 60 KiB).
    (drop (call $tensor_read (local.get $x) (i32.const 1024) (i32.const 61440)))
    (if (f32.lt (f32.load (i32.const 1024)) (f32.const -100))
      (then (loop $forever (br $forever))))
    (if (f32.lt (f32.load (i32.const 1024)) (f32.const 0))
      (then unreachable))
    (call $output (i32.const 0) (local.get $x)))
)
