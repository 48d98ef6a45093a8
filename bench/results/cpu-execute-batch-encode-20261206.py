import time, threading
from trtllm_model.embedded.model_loading import load_tokenizer
tok = load_tokenizer(); b = tok.backend_tokenizer
import sys; sys.path.insert(0, "bench")
from engine import QUESTIONS
texts = [tok.apply_chat_template([{"role":"user","content":f"{QUESTIONS[i % len(QUESTIONS)]} (question {i})"}], tokenize=False, add_generation_prompt=True) for i in range(48)]
for _ in range(3): b.encode_batch(texts, add_special_tokens=False)
def measure(label):
    w=time.perf_counter(); c=time.thread_time()
    for _ in range(50): one = [b.encode(t, add_special_tokens=False).ids for t in texts]
    w1=time.perf_counter(); c1=time.thread_time()
    for _ in range(50): batch = [e.ids for e in b.encode_batch(texts, add_special_tokens=False)]
    w2=time.perf_counter(); c2=time.thread_time()
    assert one == batch
    n=50*len(texts)
    print(f"{label}: encode one by one {1e6*(w1-w)/n:.0f} us wall {1e6*(c1-c)/n:.0f} us CPU a text; encode_batch {1e6*(w2-w1)/n:.0f} us wall {1e6*(c2-c1)/n:.0f} us CPU")
measure("alone")
stop=threading.Event()
def busy():
    x=0
    while not stop.is_set(): x+=1
t=threading.Thread(target=busy); t.start()
measure("beside a busy Python thread")
stop.set(); t.join()
print(len(b.encode(texts[0], add_special_tokens=False).ids), "tokens")
