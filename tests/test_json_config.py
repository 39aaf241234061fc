"""--speculative-config and --kv-transfer-config take a dict or JSON text; bad text names its flag."""
import pytest

from inflight.config import SpeculativeConfig
from inflight.distributed.kv_transfer.config import KVTransferConfig


@pytest.mark.parametrize("cls,name", [(SpeculativeConfig, "speculative_config"), (KVTransferConfig, "kv_transfer_config")])
@pytest.mark.parametrize("text,message", [("{", "is not valid JSON"), ("[1]", "must be a JSON object"),
                                          ('{"no_such_key": 1}', "unknown {name} keys: ['no_such_key']")])
def test_bad_json_config_names_the_setting(cls, name, text, message):
    with pytest.raises(ValueError) as e:
        cls.parse(text)
    assert str(e.value).startswith(name) or "unknown" in str(e.value)
    assert message.format(name=name) in str(e.value)


def test_json_text_dict_and_instance_give_the_same_config():
    text = '{"method": "ngram", "num_speculative_tokens": 3}'
    cfg = SpeculativeConfig.parse(text)
    assert cfg == SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 3})
    assert SpeculativeConfig.parse(cfg) is cfg and SpeculativeConfig.parse(None) is None
    assert KVTransferConfig.parse('{"kv_role": "kv_consumer"}').is_consumer


def test_kv_transfer_config_values_are_validated():
    with pytest.raises(ValueError, match="kv_role"):
        KVTransferConfig.parse('{"kv_role": "nope"}')
