;; hostile_params.wat: moe_init declares one-element parameters with
;; distinct names until the host refuses one (2M of them once kept
;; 1,470 MB for 8 MB charged), and returns the host's code.
(module
  (import "moehost_v1" "declare_input" (func $declare_input (param i32 i32 i32 i32 i32) (result i32)))
  (import "moehost_v1" "declare_output" (func $declare_output (param i32 i32 i32 i32 i32) (result i32)))
  (import "moehost_v1" "param_new" (func $param_new (param i32 i32 i32 i32 i32 i32 f64 f64) (result i32)))
  (import "moehost_v1" "input" (func $input (param i32) (result i32)))
  (import "moehost_v1" "output" (func $output (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  ;; 0 "x", 8 "y", 16 shape [-1 2], 112 shape [1], 200 the name.
  (data (i32.const 0) "x")
  (data (i32.const 8) "y")
  (data (i32.const 16) "\ff\ff\ff\ff\ff\ff\ff\ff\02\00\00\00\00\00\00\00")
  (data (i32.const 112) "\01\00\00\00\00\00\00\00")

  (func (export "moe_abi_version") (result i32) (i32.const 1))

  (func (export "moe_init") (result i32)
    (local $r i32) (local $i i32)
    (local.set $r (call $declare_input (i32.const 0) (i32.const 1) (i32.const 1) (i32.const 16) (i32.const 2)))
    (if (i32.lt_s (local.get $r) (i32.const 0)) (then (return (local.get $r))))
    (local.set $r (call $declare_output (i32.const 8) (i32.const 1) (i32.const 1) (i32.const 16) (i32.const 2)))
    (if (i32.lt_s (local.get $r) (i32.const 0)) (then (return (local.get $r))))
    (loop $more
      ;; The name: i in four base-64 digits, each '0' + digit.
      (i32.store (i32.const 200)
        (i32.add (i32.const 0x30303030)
          (i32.or
            (i32.or (i32.and (local.get $i) (i32.const 63))
                    (i32.shl (i32.and (i32.shr_u (local.get $i) (i32.const 6)) (i32.const 63)) (i32.const 8)))
            (i32.or (i32.shl (i32.and (i32.shr_u (local.get $i) (i32.const 12)) (i32.const 63)) (i32.const 16))
                    (i32.shl (i32.and (i32.shr_u (local.get $i) (i32.const 18)) (i32.const 63)) (i32.const 24))))))
      (local.set $r (call $param_new (i32.const 200) (i32.const 4) (i32.const 1) (i32.const 112) (i32.const 1)
        (i32.const 1) (f64.const 0) (f64.const 0)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $more (i32.ge_s (local.get $r) (i32.const 0))))
    (local.get $r))

  (func (export "moe_forward") (result i32)
    (call $output (i32.const 0) (call $input (i32.const 0))))
)
